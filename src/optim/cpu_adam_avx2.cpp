// AVX2+FMA+F16C Adam kernel: 8 floats per iteration, compiled for that target only through a
// function attribute so the library itself needs no -mavx2; picked at run time.
#include <immintrin.h>

#include "optim/cpu_adam_kernels.h"

// Same rounding as the scalar kernel: only the explicit FMA below, no contraction of mul+add.
#pragma GCC optimize("fp-contract=off")

namespace deepspeed::optim::detail {
namespace {

#define DS_AVX2 __attribute__((target("avx2,fma,f16c"), always_inline)) inline

// c10::BFloat16's rule in integers: (u + 0x7FFF + lsb) >> 16, NaN -> 0x7FC0.
DS_AVX2 __m128i to_bf16(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb);
  r = _mm256_srli_epi32(r, 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), nan);
  // Every lane is <= 0xFFFF, so the unsigned-saturating pack is a plain narrowing.
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

}  // namespace

__attribute__((target("avx2,fma,f16c"))) void adam_kernel_avx2(float* param, const float* grad,
                                                               float* m, float* v, int64_t n,
                                                               const AdamConsts& c,
                                                               uint16_t* param16,
                                                               Half16Kind kind) {
  const __m256 grad_scale = _mm256_set1_ps(c.grad_scale);
  const __m256 decay_mul = _mm256_set1_ps(c.decay_mul);
  const __m256 l2 = _mm256_set1_ps(c.l2);
  const __m256 b1 = _mm256_set1_ps(c.beta1), omb1 = _mm256_set1_ps(c.one_minus_beta1);
  const __m256 b2 = _mm256_set1_ps(c.beta2), omb2 = _mm256_set1_ps(c.one_minus_beta2);
  const __m256 sqrt_bc2 = _mm256_set1_ps(c.sqrt_bc2), eps = _mm256_set1_ps(c.eps);
  const __m256 neg_step = _mm256_set1_ps(c.neg_step_size);
  const int64_t body = n - n % 8;
  for (int64_t i = 0; i < body; i += 8) {
    __m256 g = _mm256_loadu_ps(grad + i);
    __m256 p = _mm256_loadu_ps(param + i);
    if (c.scale_grad) g = _mm256_mul_ps(g, grad_scale);
    if (c.decoupled_decay) p = _mm256_mul_ps(p, decay_mul);
    if (c.l2_decay) g = _mm256_fmadd_ps(p, l2, g);
    const __m256 mi = _mm256_fmadd_ps(g, omb1, _mm256_mul_ps(_mm256_loadu_ps(m + i), b1));
    const __m256 vi = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(v + i), b2),
                                    _mm256_mul_ps(_mm256_mul_ps(omb2, g), g));
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), sqrt_bc2), eps);
    p = _mm256_add_ps(p, _mm256_div_ps(_mm256_mul_ps(neg_step, mi), denom));
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    _mm256_storeu_ps(param + i, p);
    if (param16 != nullptr) {
      const __m128i h = kind == Half16Kind::BF16
                            ? to_bf16(p)
                            : _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(param16 + i), h);
    }
  }
  adam_kernel_scalar(param + body, grad + body, m + body, v + body, n - body, c,
                     param16 != nullptr ? param16 + body : nullptr, kind);
}

__attribute__((target("avx2,fma,f16c"))) void widen_16_avx2(const uint16_t* in, bool fp16,
                                                            float* out, int64_t n) {
  const int64_t body = n - n % 8;
  for (int64_t i = 0; i < body; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    const __m256 f = fp16 ? _mm256_cvtph_ps(h)
                          : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    _mm256_storeu_ps(out + i, f);
  }
  if (!fp16) return widen_bf16_scalar(in + body, out + body, n - body);
  for (int64_t i = body; i < n; ++i) out[i] = _cvtsh_ss(in[i]);
}

__attribute__((target("avx2,fma,f16c"))) void narrow_16_avx2(const float* in, bool fp16,
                                                             uint16_t* out, int64_t n) {
  const int64_t body = n - n % 8;
  for (int64_t i = 0; i < body; i += 8) {
    const __m256 f = _mm256_loadu_ps(in + i);
    const __m128i h =
        fp16 ? _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC) : to_bf16(f);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (int64_t i = body; i < n; ++i)
    out[i] = fp16 ? _cvtss_sh(in[i], _MM_FROUND_TO_NEAREST_INT) : float_to_bf16_bits(in[i]);
}

}  // namespace deepspeed::optim::detail
