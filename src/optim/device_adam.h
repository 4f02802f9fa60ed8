// The Adam/AdamW update for parameters that live on a GPU (or any non-CPU device): FusedAdam's
// device path. libtorch 2.x: one launch of libtorch's fused multi-tensor kernel
// (at::_fused_adam_/_fused_adamw_, the kernel behind torch.optim.AdamW(fused=True)); libtorch
// 1.13, or Adam without bias correction (which that kernel lacks): the same formula as
// cpu_adam.h in tensor operations. Results agree with the CPU kernel to float rounding, not bits.
#pragma once
#include <ATen/Tensor.h>

#include "optim/cpu_adam.h"

namespace deepspeed {
namespace optim {

// Updates param, exp_avg, exp_avg_sq in place (all fp32, contiguous, one device); the gradient
// is multiplied by p.grad_scale first. When `half_copy` is defined (bf16/fp16, same numel), the
// updated param is also written there. `grad_is_scratch`: with a grad scale the gradient may be
// left scaled (the fused kernel unscales in place); otherwise it is not modified.
void device_adam_step(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                      at::Tensor& exp_avg_sq, const AdamStepParams& p, at::Tensor half_copy,
                      bool grad_is_scratch = false);

}  // namespace optim
}  // namespace deepspeed
