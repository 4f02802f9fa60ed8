// The Adam/AdamW update for parameters that live on a GPU (or any non-CPU device): FusedAdam's
// device path. On an NVIDIA GPU in a CUDA build (DS_WITH_CUDA_KERNELS): deepspeed.cpp's own
// kernel (device_adam_kernel.h), one pass that reads 16-bit gradients as they are and writes the
// 16-bit copy, equal to the CPU kernel bit for bit. Otherwise, libtorch 2.x: one launch of
// libtorch's fused multi-tensor kernel (at::_fused_adam_/_fused_adamw_, the kernel behind
// torch.optim.AdamW(fused=True)); libtorch 1.13, or Adam without bias correction (which that
// kernel lacks): the same formula as cpu_adam.h in tensor operations. These two agree with the
// CPU kernel to float rounding, not bits.
#pragma once
#include <ATen/Tensor.h>

#include <cstdint>

#include "optim/cpu_adam.h"

namespace deepspeed {
namespace optim {

// Whether device_adam_step runs this library's kernel on a CUDA master, which reads bf16/fp16
// gradients as they are: then mixed precision steps its 16-bit gradients without a widened fp32
// copy. True where the build has the kernel, unless the environment variable DS_DEVICE_ADAM is
// "libtorch" (libtorch's fused kernel instead: a benchmark's comparison, or a way around a
// kernel fault). Throws std::invalid_argument naming the variable for a value other than
// "deepspeed" or "libtorch".
bool device_adam_reads_16bit_grads();
// Whether this build has the kernel (CUDA libtorch; CMakeLists.txt), whatever DS_DEVICE_ADAM says.
bool device_adam_kernel_built();

// Updates param, exp_avg, exp_avg_sq in place (all fp32, contiguous, one device); the gradient
// (fp32; or bf16/fp16 on CUDA where device_adam_reads_16bit_grads()) is multiplied by
// p.grad_scale first. When `half_copy` is defined (bf16/fp16, same numel), the
// updated param is also written there. `grad_is_scratch`: with a grad scale the gradient may be
// left scaled (the fused kernel unscales in place); otherwise it is not modified.
void device_adam_step(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                      at::Tensor& exp_avg_sq, const AdamStepParams& p, at::Tensor half_copy,
                      bool grad_is_scratch = false);

// The same for a master of any format FusedAdam keeps on a device: fp32 (device_adam_step), or
// a 16-bit master (bf16/fp16_master_weights_and_grads) with fp32 or bf16 moments, updated in fp32
// on widened copies and rounded back, `chunk` elements at a time so that the copies stay a
// bounded transient (widening the whole partition at once would raise the step's peak above fp32
// masters' 12 bytes an element). 16-bit gradients are read as they are where the kernel can
// (device_adam_reads_16bit_grads), else widened with their chunk. `target` (optional): where the
// updated 16-bit values are also written.
void device_adam_step_any_master(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                                 at::Tensor& exp_avg_sq, const AdamStepParams& p,
                                 const at::Tensor& target, bool grad_is_scratch = false,
                                 int64_t chunk = int64_t{1} << 24);

}  // namespace optim
}  // namespace deepspeed
