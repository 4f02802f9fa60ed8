// How tensors travel through libtorch 1.13's Gloo group, which rejects bf16 and int16 ("Invalid
// scalar type") and crashes (SIGFPE) on zero-element collectives. Measured here: Gloo accepts
// float, double, half, int8, uint8, int32, int64 for allreduce (sum and max), broadcast,
// allgather, alltoall_base and send/recv.
#pragma once
#include <ATen/Tensor.h>

#include <string>

namespace deepspeed {
namespace comm {

bool gloo_accepts(at::ScalarType type);

// A same-size dtype Gloo accepts, for moving bits unchanged (bf16/int16 -> Half, bool -> Byte).
// Throws CommError for dtypes with no such twin (e.g. complex), naming `op`.
at::ScalarType bits_dtype(at::ScalarType type, const char* op);

// The dtype Gloo reduces in for `type` (bf16 -> float, int16 -> int32, bool -> uint8).
at::ScalarType reduce_dtype(at::ScalarType type, const char* op);

// The dtype a local sum of received chunks accumulates in (16-bit floats -> float).
at::ScalarType accumulate_dtype(at::ScalarType type);

// A contiguous tensor sharing `t`'s bits, viewed as `wire` (same element size); copies only when
// `t` is not contiguous.
at::Tensor bits_view(const at::Tensor& t, at::ScalarType wire);

// "float", "bfloat16", "long", ... for messages.
std::string dtype_name(at::ScalarType type);

}  // namespace comm
}  // namespace deepspeed
