#include "optim/device_adam.h"

#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>

#if TORCH_VERSION_MAJOR >= 2
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>
#endif
#if DS_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "optim/device_adam_kernel.h"
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

#if DS_WITH_CUDA_KERNELS
GradFormat grad_format_of(const at::Tensor& grad) {
  switch (grad.scalar_type()) {
    case at::kFloat: return GradFormat::FP32;
    case at::kBFloat16: return GradFormat::BF16;
    case at::kHalf: return GradFormat::FP16;
    default:
      TORCH_CHECK(false, "device_adam_step: gradients of dtype ", grad.scalar_type(),
                  "; the GPU Adam kernel reads fp32, bf16 or fp16");
  }
}

// deepspeed.cpp's kernel (device_adam_kernel.cu): every tensor on param's GPU, contiguous.
void cuda_adam_step(at::Tensor& param, const at::Tensor& grad, at::Tensor& m, at::Tensor& v,
                    const AdamStepParams& p, const at::Tensor& half_copy) {
  const int64_t n = param.numel();
  auto check = [&](const at::Tensor& t, const char* what) {
    TORCH_CHECK(t.device() == param.device() && t.is_contiguous() && t.numel() == n,
                "device_adam_step: ", what, " must be a contiguous tensor of ", n,
                " elements on ", param.device(), "; got ", t.numel(), " on ", t.device());
  };
  TORCH_CHECK(param.scalar_type() == at::kFloat && m.scalar_type() == at::kFloat &&
                  v.scalar_type() == at::kFloat,
              "device_adam_step: the master and the moments must be fp32");
  check(param, "the master");
  check(m, "exp_avg");
  check(v, "exp_avg_sq");
  check(grad, "the gradient");
  DeviceAdamBuffers b;
  b.param = param.data_ptr<float>();
  b.grad = grad.data_ptr();
  b.grad_format = grad_format_of(grad);
  b.exp_avg = m.data_ptr<float>();
  b.exp_avg_sq = v.data_ptr<float>();
  b.n = n;
  if (half_copy.defined()) {
    check(half_copy, "the 16-bit copy");
    TORCH_CHECK(half_copy.scalar_type() == at::kBFloat16 || half_copy.scalar_type() == at::kHalf,
                "device_adam_step: the 16-bit copy is ", half_copy.scalar_type());
    b.half = static_cast<uint16_t*>(half_copy.data_ptr());
    b.half_kind = half_copy.scalar_type() == at::kHalf ? Half16Kind::FP16 : Half16Kind::BF16;
  }
  const c10::cuda::CUDAGuard on_device(param.device());
  launch_device_adam(b, detail::make_adam_consts(p),
                     c10::cuda::getCurrentCUDAStream(param.device().index()).stream());
}
#endif

}  // namespace

bool device_adam_kernel_built() {
#if DS_WITH_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

bool device_adam_reads_16bit_grads() {
  // Read at every call (once per step): a benchmark or a test may switch between the two.
  const char* env = std::getenv("DS_DEVICE_ADAM");
  const std::string choice = env != nullptr ? env : "";
  if (choice == "libtorch") return false;
  if (!choice.empty() && choice != "deepspeed")
    throw std::invalid_argument("DS_DEVICE_ADAM='" + choice +
                                "': expected deepspeed (this library's GPU Adam kernel, the "
                                "default) or libtorch (libtorch's fused kernel)");
  return device_adam_kernel_built();
}

void device_adam_step(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                      at::Tensor& exp_avg_sq, const AdamStepParams& p, at::Tensor half_copy,
                      bool grad_is_scratch) {
  torch::NoGradGuard no_grad;
#if DS_WITH_CUDA_KERNELS
  if (param.is_cuda() && device_adam_reads_16bit_grads())
    return cuda_adam_step(param, grad, exp_avg, exp_avg_sq, p, half_copy);
#endif
  TORCH_CHECK(grad.scalar_type() == at::kFloat, "device_adam_step: ", grad.scalar_type(),
              " gradients need this library's GPU Adam kernel (a CUDA build, DS_DEVICE_ADAM "
              "unset or \"deepspeed\"); libtorch's kernel and the tensor formula read fp32");
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

void device_adam_step_any_master(at::Tensor& param, const at::Tensor& grad, at::Tensor& m,
                                 at::Tensor& v, const AdamStepParams& hp, const at::Tensor& target,
                                 bool grads_are_scratch, int64_t chunk) {
  if (param.scalar_type() == at::kFloat && m.scalar_type() == at::kFloat)
    return device_adam_step(param, grad, m, v, hp, target, grads_are_scratch);
  TORCH_CHECK(chunk > 0, "device_adam_step_any_master: chunk must be positive, got ", chunk);
  torch::NoGradGuard no_grad;
  // libtorch's kernel and the tensor formula read fp32 gradients only: 16-bit ones are widened
  // a chunk at a time too (4 bytes an element of the chunk, beside the master's and moments').
  const bool widen_grads =
      grad.scalar_type() != at::kFloat && !(param.is_cuda() && device_adam_reads_16bit_grads());
  const int64_t n = param.numel();
  auto piece = [](const at::Tensor& t, int64_t off, int64_t len) {
    return t.view({-1}).narrow(0, off, len);
  };
  for (int64_t off = 0; off < n; off += chunk) {
    const int64_t len = std::min(chunk, n - off);
    at::Tensor p16 = piece(param, off, len), m_in = piece(m, off, len), v_in = piece(v, off, len);
    // to(kFloat) of fp32 moments is the moments themselves: updated in place, no copy.
    at::Tensor p32 = p16.to(at::kFloat), m32 = m_in.to(at::kFloat), v32 = v_in.to(at::kFloat);
    const at::Tensor g = widen_grads ? piece(grad, off, len).to(at::kFloat) : piece(grad, off, len);
    device_adam_step(p32, g, m32, v32, hp, at::Tensor(), grads_are_scratch || widen_grads);
    p16.copy_(p32);
    if (!m32.is_same(m_in)) m_in.copy_(m32);
    if (!v32.is_same(v_in)) v_in.copy_(v32);
    if (target.defined()) piece(target, off, len).copy_(p16);
  }
}

}  // namespace optim
}  // namespace deepspeed
