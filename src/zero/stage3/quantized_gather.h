// qwZ: a unit's all-gather with every rank's slice sent as int8 blocks (comm/quantize.h), a
// quarter of the fp32 bytes (half of bf16/fp16), plus one fp32 scale per 8000 elements.
#pragma once
#include <cstdint>

#include <ATen/Tensor.h>

#include "deepspeed/comm.h"

namespace deepspeed {
namespace zero {

// Starts the all-gather of `slice` into `full` (world_size * slice.numel() elements, any floating
// dtype): the slice is quantized now, the wire forms are all-gathered, and wait() dequantizes
// every rank's part into its place in `full` (this rank's own part too, so all ranks hold the
// same values). COLLECTIVE over `comm`; `full` must stay alive until wait().
comm::WorkPtr quantized_all_gather(comm::Communicator& comm, at::Tensor& full,
                                   const at::Tensor& slice);
// The bytes its wire forms (this rank's slice and every rank's) hold until wait().
int64_t quantized_gather_wire_bytes(int64_t slice_numel, int world_size);

}  // namespace zero
}  // namespace deepspeed
