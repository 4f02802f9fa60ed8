// AVX-512F Adam kernel: 16 floats per iteration, compiled for that target only through a
// function attribute so the library itself needs no -mavx512f; picked at run time.
#include <immintrin.h>

#include "optim/cpu_adam_kernels.h"

// Same rounding as the scalar kernel: only the explicit FMA below, no contraction of mul+add.
#pragma GCC optimize("fp-contract=off")
// GCC 12 reports its own _mm512_undefined_*() placeholders (self-initialised on purpose) as
// "may be used uninitialized" once inlined here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace deepspeed::optim::detail {
namespace {

#define DS_AVX512 __attribute__((target("avx512f"), always_inline)) inline

// c10::BFloat16's rule in integers: (u + 0x7FFF + lsb) >> 16, NaN -> 0x7FC0. Not
// _mm512_cvtneps_pbh: it flushes denormals to zero, so it would differ from libtorch there,
// and this kernel is memory-bound, so the extra integer ops cost nothing measurable.
DS_AVX512 __m256i to_bf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb);
  r = _mm512_srli_epi32(r, 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(r);
}

}  // namespace

__attribute__((target("avx512f"))) void adam_kernel_avx512(float* param, const float* grad,
                                                           float* m, float* v, int64_t n,
                                                           const AdamConsts& c,
                                                           uint16_t* param16, Half16Kind kind) {
  const __m512 grad_scale = _mm512_set1_ps(c.grad_scale);
  const __m512 decay_mul = _mm512_set1_ps(c.decay_mul);
  const __m512 l2 = _mm512_set1_ps(c.l2);
  const __m512 b1 = _mm512_set1_ps(c.beta1), omb1 = _mm512_set1_ps(c.one_minus_beta1);
  const __m512 b2 = _mm512_set1_ps(c.beta2), omb2 = _mm512_set1_ps(c.one_minus_beta2);
  const __m512 sqrt_bc2 = _mm512_set1_ps(c.sqrt_bc2), eps = _mm512_set1_ps(c.eps);
  const __m512 neg_step = _mm512_set1_ps(c.neg_step_size);
  const int64_t body = n - n % 16;
  for (int64_t i = 0; i < body; i += 16) {
    __m512 g = _mm512_loadu_ps(grad + i);
    __m512 p = _mm512_loadu_ps(param + i);
    if (c.scale_grad) g = _mm512_mul_ps(g, grad_scale);
    if (c.decoupled_decay) p = _mm512_mul_ps(p, decay_mul);
    if (c.l2_decay) g = _mm512_fmadd_ps(p, l2, g);
    const __m512 mi = _mm512_fmadd_ps(g, omb1, _mm512_mul_ps(_mm512_loadu_ps(m + i), b1));
    const __m512 vi = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(v + i), b2),
                                    _mm512_mul_ps(_mm512_mul_ps(omb2, g), g));
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), sqrt_bc2), eps);
    p = _mm512_add_ps(p, _mm512_div_ps(_mm512_mul_ps(neg_step, mi), denom));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    _mm512_storeu_ps(param + i, p);
    if (param16 != nullptr) {
      const __m256i h = kind == Half16Kind::BF16
                            ? to_bf16(p)
                            : _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(param16 + i), h);
    }
  }
  adam_kernel_scalar(param + body, grad + body, m + body, v + body, n - body, c,
                     param16 != nullptr ? param16 + body : nullptr, kind);
}

}  // namespace deepspeed::optim::detail
