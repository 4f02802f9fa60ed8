// deepspeed.cpp's Adam/AdamW kernel for NVIDIA GPUs (device_adam_kernel.cu; compiled in every
// build against a CUDA libtorch: DS_WITH_CUDA_KERNELS). One pass over the partition that reads
// the gradients in the format the model produced them (fp32, bf16 or fp16) and writes the model's
// 16-bit copy of the updated master in the same pass: 28 bytes per element with bf16 gradients
// and a bf16 copy, where libtorch's fused kernel (fp32 gradients only) needs a widened copy of the
// gradients before it and a rounding pass after it (40 bytes, and 4 bytes per element more
// memory at the step). Its arithmetic is adam_math.h's, so it equals the CPU kernel bit for bit
// (finite values).
// No torch header here: nvcc compiles only the kernel; device_adam.cpp checks the tensors.
#pragma once

#include <cstdint>

#include "optim/adam_math.h"

namespace deepspeed::optim {

enum class GradFormat { FP32, BF16, FP16 };

// The buffers of one update, all on one GPU, none overlapping another.
struct DeviceAdamBuffers {
  float* param = nullptr;         // fp32 master, updated in place
  const void* grad = nullptr;     // gradients in `grad_format`
  GradFormat grad_format = GradFormat::FP32;
  float* exp_avg = nullptr;       // fp32 moments, updated in place
  float* exp_avg_sq = nullptr;
  uint16_t* half = nullptr;       // null, or the 16-bit copy written with the new param
  Half16Kind half_kind = Half16Kind::BF16;
  int64_t n = 0;
};

// Queues the update of b.n elements on `stream` (a cudaStream_t of the buffers' device, which is
// the caller's current device). Throws std::runtime_error naming the CUDA error of the launch.
void launch_device_adam(const DeviceAdamBuffers& b, const detail::AdamConsts& c, void* stream);

}  // namespace deepspeed::optim
