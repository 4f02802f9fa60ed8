// AVX-512F Adam kernel: 16 floats per iteration, compiled for that target only through a
// function attribute so the library itself needs no -mavx512f; picked at run time.
#include <immintrin.h>

#include <cstdint>

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

// One vector of 16 elements: updates param, m and v in place and returns the new param.
struct Avx512Step {
  __m512 grad_scale, decay_mul, l2, b1, omb1, b2, omb2, sqrt_bc2, eps, neg_step;
  const AdamConsts& c;

  DS_AVX512 explicit Avx512Step(const AdamConsts& k)
      : grad_scale(_mm512_set1_ps(k.grad_scale)), decay_mul(_mm512_set1_ps(k.decay_mul)),
        l2(_mm512_set1_ps(k.l2)), b1(_mm512_set1_ps(k.beta1)),
        omb1(_mm512_set1_ps(k.one_minus_beta1)), b2(_mm512_set1_ps(k.beta2)),
        omb2(_mm512_set1_ps(k.one_minus_beta2)), sqrt_bc2(_mm512_set1_ps(k.sqrt_bc2)),
        eps(_mm512_set1_ps(k.eps)), neg_step(_mm512_set1_ps(k.neg_step_size)), c(k) {}

  DS_AVX512 __m512 operator()(float* param, const float* grad, float* m, float* v) const {
    __m512 g = _mm512_loadu_ps(grad);
    __m512 p = _mm512_loadu_ps(param);
    if (c.scale_grad) g = _mm512_mul_ps(g, grad_scale);
    if (c.decoupled_decay) p = _mm512_mul_ps(p, decay_mul);
    if (c.l2_decay) g = _mm512_fmadd_ps(p, l2, g);
    const __m512 mi = _mm512_fmadd_ps(g, omb1, _mm512_mul_ps(_mm512_loadu_ps(m), b1));
    const __m512 vi = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(v), b2),
                                    _mm512_mul_ps(_mm512_mul_ps(omb2, g), g));
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), sqrt_bc2), eps);
    p = _mm512_add_ps(p, _mm512_div_ps(_mm512_mul_ps(neg_step, mi), denom));
    _mm512_storeu_ps(m, mi);
    _mm512_storeu_ps(v, vi);
    _mm512_storeu_ps(param, p);
    return p;
  }
};

DS_AVX512 __m256i to_half16(__m512 p, Half16Kind kind) {
  return kind == Half16Kind::BF16 ? to_bf16(p)
                                  : _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

}  // namespace

__attribute__((target("avx512f"))) void adam_kernel_avx512(float* param, const float* grad,
                                                           float* m, float* v, int64_t n,
                                                           const AdamConsts& c,
                                                           uint16_t* param16, Half16Kind kind) {
  const Avx512Step step(c);
  int64_t i = 0;
  if (param16 != nullptr) {
    // The 16-bit copy goes out in whole cache lines with streaming stores: nothing reads it on
    // this core (the upload ring is copied to the GPU; a CPU model reads it in the next forward,
    // from memory anyway at any size that matters), and an ordinary store would first read each
    // line it writes into the cache. Measured on bench_cpu_adam's bf16 row: +20-30% on one
    // thread here; on the H200 machine's 16 threads that row ran at 67% of the memory bandwidth
    // against 91% without the copy (docs/benchmarks.md). Streaming stores need 64-byte aligned
    // lines: the elements before the first aligned one take the scalar kernel (same rounding).
    const auto misalign = reinterpret_cast<uintptr_t>(param16) % 64;
    int64_t head = misalign == 0 ? 0 : static_cast<int64_t>((64 - misalign) / 2);
    if (misalign % 2 != 0 || head > n) head = n;  // not even 2-byte aligned: no streaming
    adam_kernel_scalar(param, grad, m, v, head, c, param16, kind);
    i = head;
    for (; i + 32 <= n; i += 32) {
      const __m256i lo = to_half16(step(param + i, grad + i, m + i, v + i), kind);
      const __m256i hi = to_half16(step(param + i + 16, grad + i + 16, m + i + 16, v + i + 16), kind);
      _mm512_stream_si512(reinterpret_cast<__m512i*>(param16 + i),
                          _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
    }
    // Streaming stores are weakly ordered: make them visible before anything this thread does
    // next (the caller's barrier, the event that lets the upload read the ring).
    _mm_sfence();
  }
  const int64_t body = n - (n - i) % 16;
  for (; i < body; i += 16) {
    const __m512 p = step(param + i, grad + i, m + i, v + i);
    if (param16 != nullptr)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(param16 + i), to_half16(p, kind));
  }
  adam_kernel_scalar(param + i, grad + i, m + i, v + i, n - i, c,
                     param16 != nullptr ? param16 + i : nullptr, kind);
}

__attribute__((target("avx512f"))) void widen_bf16_avx512(const uint16_t* in, float* out,
                                                          int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    _mm512_storeu_ps(out + i, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
  }
  widen_bf16_scalar(in + i, out + i, n - i);
}

}  // namespace deepspeed::optim::detail
