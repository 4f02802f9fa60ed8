// The reductions a backend finishes on this rank: c10d's op for ours, Avg as Sum then a division,
// and the local reduce of received chunks (reduce-scatter built from an all-to-all).
#pragma once
#include <ATen/Tensor.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "deepspeed/comm.h"

namespace deepspeed {
namespace comm {

// c10d's op for `op`; Avg maps to Sum (the caller divides, the same rounding on every backend).
c10d::ReduceOp to_c10d(ReduceOp op);

// t /= n in place (integers truncate).
void divide_by(at::Tensor& t, int n);

// op over dimension 0 of [world, n] received chunks; 16-bit floats accumulate in fp32.
at::Tensor reduce_chunks(const at::Tensor& chunks, ReduceOp op, int world);

}  // namespace comm
}  // namespace deepspeed
