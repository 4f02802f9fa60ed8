// The Adam/AdamW update of one element and the float constants it uses: the one formula behind
// the CPU kernels (cpu_adam*.cpp; the SIMD paths equal the scalar one bit for bit) and the GPU
// kernel (device_adam_kernel.cu). Both compilers see this file: g++ for the host, nvcc for the
// device. Each operation is one IEEE-rounded float operation and only the explicit fmaf calls
// are fused: host code here is compiled with fp-contract off (the pragma below), device code
// with --fmad=false (CMakeLists.txt), and sqrtf and `/` are correctly rounded on both (nvcc's
// default -prec-sqrt/-prec-div; clang: the fp contract pragma in adam_update). So for finite
// values a GPU update equals the CPU's bit for bit, and ZeRO-Offload (CPU Adam) trains exactly as
// the same run with the optimizer on the GPU. (NaN payloads may differ: the GPU's arithmetic
// makes the canonical NaN, x86 keeps the payload.)
#pragma once

#include <math.h>

#include <cstdint>

#include "optim/cpu_adam.h"

#if defined(__CUDACC__)
#define DS_HOST_DEVICE __host__ __device__
#else
#define DS_HOST_DEVICE
#endif

#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif

namespace deepspeed::optim::detail {

// Step constants, each computed in double and rounded to float once (as libtorch does when it
// turns a double option into a Scalar applied to a float tensor).
struct AdamConsts {
  float grad_scale;      // g = grad * grad_scale (skipped when 1)
  float decay_mul;       // adamw: param *= decay_mul = 1 - lr*wd (skipped when wd == 0)
  float l2;              // adam:  g = fma(param, l2, g)          (skipped when wd == 0)
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float sqrt_bc2;        // sqrt(1 - beta2^step)
  float eps;
  float neg_step_size;   // -lr / (1 - beta1^step)
  bool scale_grad, decoupled_decay, l2_decay;
};

// The constants of one step (host only). Throws std::invalid_argument for step < 1 with bias
// correction.
AdamConsts make_adam_consts(const AdamStepParams& p);

// One element: p, m, v updated in place from its gradient g (before grad_scale).
//   g  = grad * grad_scale
//   adamw_mode:  param *= (1 - lr*wd)          (decoupled decay)
//   else:        g     += wd * param           (L2)
//   m  = b1*m + (1-b1)*g;   v = b2*v + (1-b2)*g*g
//   param += (-lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps)
// in libtorch's op order (exp_avg.mul_(b1).add_(g, 1-b1) is one fma there too).
DS_HOST_DEVICE inline void adam_update(float g, float& p, float& m, float& v, const AdamConsts& c) {
#if defined(__clang__) && !defined(__CUDACC__)
#pragma clang fp contract(off)
#endif
  if (c.scale_grad) g = g * c.grad_scale;
  if (c.decoupled_decay) p = p * c.decay_mul;
  if (c.l2_decay) g = fmaf(p, c.l2, g);
  const float mi = fmaf(g, c.one_minus_beta1, m * c.beta1);
  const float vi = v * c.beta2 + (c.one_minus_beta2 * g) * g;
  const float denom = sqrtf(vi) / c.sqrt_bc2 + c.eps;
  p = p + (c.neg_step_size * mi) / denom;
  m = mi;
  v = vi;
}

// fp32 -> bf16 bits, round to nearest even, NaN -> 0x7FC0: c10::BFloat16(float)'s rule.
DS_HOST_DEVICE inline uint16_t float_to_bf16_bits(float x) {
#if defined(__CUDA_ARCH__)
  const uint32_t u = __float_as_uint(x);
#else
  uint32_t u;
  __builtin_memcpy(&u, &x, 4);
#endif
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace deepspeed::optim::detail

#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#pragma GCC pop_options
#endif
