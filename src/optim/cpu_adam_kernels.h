// Internal to cpu_adam*.cpp: the per-ISA kernels and the float constants they share.
#pragma once

#include <cstdint>

#include "optim/adam_math.h"  // AdamConsts, adam_update, float_to_bf16_bits
#include "optim/cpu_adam.h"

namespace deepspeed::optim::detail {

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
// 16-bit (bf16 or fp16) bits <-> fp32, 8 at a time (AVX2 + F16C): widening exact, narrowing to
// nearest even, bit for bit c10::BFloat16's / c10::Half's (cpu_adam_buffers.cpp's scalar ones).
void widen_16_avx2(const uint16_t* in, bool fp16, float* out, int64_t n);
void narrow_16_avx2(const float* in, bool fp16, uint16_t* out, int64_t n);

// The kernel of the instruction set in use now, and the OpenMP team an adam_step call with these
// parameters runs (cpu_adam.cpp), for adam_step_buffers (cpu_adam_buffers.cpp).
AdamKernel current_kernel();
AdamIsa current_adam_isa();
int adam_thread_count(const AdamStepParams& p);
// adam_step's OpenMP split: chunks of this many elements; calls below kParallelMin run serially.
constexpr int64_t kAdamChunk = int64_t{1} << 15;
constexpr int64_t kAdamParallelMin = 2 * kAdamChunk;

}  // namespace deepspeed::optim::detail
