#include "optim/device_adam.h"

#include <torch/torch.h>
#include <torch/version.h>

#include <cmath>

#if TORCH_VERSION_MAJOR >= 2
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>
#endif

namespace deepspeed {
namespace optim {
namespace {

// cpu_adam.h's formula, op for op, in tensor operations.
void tensor_adam_step(at::Tensor& param, const at::Tensor& grad, at::Tensor& m, at::Tensor& v,
                      const AdamStepParams& p, bool grad_is_scratch) {
  at::Tensor g = grad;
  if (p.grad_scale != 1.0f) g = grad_is_scratch ? grad.mul_(p.grad_scale) : grad * p.grad_scale;
  if (p.weight_decay != 0.0f) {
    if (p.adamw_mode)
      param.mul_(1.0 - static_cast<double>(p.lr) * p.weight_decay);
    else
      g = g + param * p.weight_decay;
  }
  m.mul_(p.beta1).add_(g, 1.0 - p.beta1);
  v.mul_(p.beta2).addcmul_(g, g, 1.0 - p.beta2);
  const double bc1 = p.bias_correction ? 1.0 - std::pow(p.beta1, p.step) : 1.0;
  const double bc2 = p.bias_correction ? 1.0 - std::pow(p.beta2, p.step) : 1.0;
  at::Tensor denom = (v.sqrt() / std::sqrt(bc2)).add_(p.eps);
  param.addcdiv_(m, denom, -static_cast<double>(p.lr) / bc1);
}

}  // namespace

void device_adam_step(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                      at::Tensor& exp_avg_sq, const AdamStepParams& p, at::Tensor half_copy,
                      bool grad_is_scratch) {
  torch::NoGradGuard no_grad;
#if TORCH_VERSION_MAJOR >= 2
  if (p.bias_correction) {
    const auto on = param.options();
    // The kernel reads the step count from a device tensor and divides gradients by grad_scale
    // (AMP's convention): ours multiplies, so it gets the reciprocal.
    at::Tensor step = at::full({}, static_cast<double>(p.step), on);
    c10::optional<at::Tensor> scale;
    if (p.grad_scale != 1.0f) scale = at::full({}, 1.0 / static_cast<double>(p.grad_scale), on);
    // grads is mutable in the kernel's signature (it unscales in place): scaled gradients the
    // caller still reads are unscaled into a copy (4 bytes per element of the partition).
    at::Tensor g = scale && !grad_is_scratch ? grad.clone() : grad;
    if (p.adamw_mode)
      at::_fused_adamw_({param}, {g}, {exp_avg}, {exp_avg_sq}, {}, {step}, p.lr, p.beta1, p.beta2,
                        p.weight_decay, p.eps, /*amsgrad=*/false, /*maximize=*/false, scale,
                        c10::nullopt);
    else
      at::_fused_adam_({param}, {g}, {exp_avg}, {exp_avg_sq}, {}, {step}, p.lr, p.beta1, p.beta2,
                       p.weight_decay, p.eps, /*amsgrad=*/false, /*maximize=*/false, scale,
                       c10::nullopt);
    if (half_copy.defined()) half_copy.copy_(param.view(half_copy.sizes()));
    return;
  }
#endif
  tensor_adam_step(param, grad, exp_avg, exp_avg_sq, p, grad_is_scratch);
  if (half_copy.defined()) half_copy.copy_(param.view(half_copy.sizes()));
}

}  // namespace optim
}  // namespace deepspeed
