// Internal to cpu_adam*.cpp: the per-ISA kernels and the float constants they share.
#pragma once

#include <cstdint>

#include "optim/cpu_adam.h"

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

// Each updates elements [0, n) of the given pointers; param16 may be null.
using AdamKernel = void (*)(float* param, const float* grad, float* m, float* v, int64_t n,
                            const AdamConsts& c, uint16_t* param16, Half16Kind kind);

void adam_kernel_scalar(float* param, const float* grad, float* m, float* v, int64_t n,
                        const AdamConsts& c, uint16_t* param16, Half16Kind kind);
void adam_kernel_avx2(float* param, const float* grad, float* m, float* v, int64_t n,
                      const AdamConsts& c, uint16_t* param16, Half16Kind kind);
void adam_kernel_avx512(float* param, const float* grad, float* m, float* v, int64_t n,
                        const AdamConsts& c, uint16_t* param16, Half16Kind kind);

// bf16 bits -> fp32 (exact: the bits are an fp32's upper half), for adam_step_bf16_grad.
inline void widen_bf16_scalar(const uint16_t* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = static_cast<uint32_t>(in[i]) << 16;
    __builtin_memcpy(&out[i], &u, 4);
  }
}
void widen_bf16_avx512(const uint16_t* in, float* out, int64_t n);

// fp32 -> bf16 bits, round to nearest even, NaN -> 0x7FC0: c10::BFloat16(float)'s rule.
inline uint16_t float_to_bf16_bits(float x) {
  uint32_t u;
  __builtin_memcpy(&u, &x, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace deepspeed::optim::detail
