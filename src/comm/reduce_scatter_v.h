// Argument checks shared by every reduce_scatter_v implementation.
#pragma once
#include <cstdint>
#include <vector>

#include <ATen/Tensor.h>

#include "deepspeed/comm.h"

namespace deepspeed {
namespace comm {

// Throws CommError unless there is one split per rank, the splits sum to input.numel() and
// output has splits[rank] elements. Returns the offset of this rank's segment in the input.
int64_t check_reduce_scatter_v(const Communicator& comm, const at::Tensor& output,
                               const at::Tensor& input, const std::vector<int64_t>& splits);

}  // namespace comm
}  // namespace deepspeed
