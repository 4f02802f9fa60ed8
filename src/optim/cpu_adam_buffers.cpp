// adam_step over buffers in mixed formats (cpu_adam.h, AdamBuffers): 16-bit masters, bf16
// moments, fp16 gradients. Each block of elements is widened into fp32 arrays on the thread's
// stack, updated by the same kernel as adam_step (so every format rounds the same fp32 update),
// and what was updated is rounded back to its buffer's format.
#include <c10/util/Half.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "optim/cpu_adam.h"
#include "optim/cpu_adam_kernels.h"

namespace deepspeed::optim {
namespace {

// Elements per block: four fp32 arrays of it (32 KiB) stay in L1/L2 between the widening, the
// kernel and the rounding. A multiple of every vector width.
constexpr int64_t kBlock = 2048;

size_t size_of(AdamElem e) { return e == AdamElem::F32 ? 4 : 2; }

void* advance(void* p, AdamElem e, int64_t k) {
  return p == nullptr ? nullptr : static_cast<char*>(p) + k * static_cast<int64_t>(size_of(e));
}

// 16-bit bits -> fp32, exactly. `vector`: 8 at a time (AVX2 + F16C), else scalar; the same bits.
void widen(const uint16_t* in, AdamElem e, float* out, int64_t n, bool vector) {
  if (vector) return detail::widen_16_avx2(in, e == AdamElem::FP16, out, n);
  if (e == AdamElem::BF16) return detail::widen_bf16_scalar(in, out, n);
  for (int64_t i = 0; i < n; ++i) out[i] = c10::detail::fp16_ieee_to_fp32_value(in[i]);
}

// fp32 -> 16-bit bits, to nearest even (c10::BFloat16's and c10::Half's rounding).
void narrow(const float* in, AdamElem e, uint16_t* out, int64_t n, bool vector) {
  if (vector) return detail::narrow_16_avx2(in, e == AdamElem::FP16, out, n);
  if (e == AdamElem::BF16) {
    for (int64_t i = 0; i < n; ++i) out[i] = detail::float_to_bf16_bits(in[i]);
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = c10::Half(in[i]).x;
}

// fp32 buffers are used in place; 16-bit ones through the block's array.
float* fp32_view(void* buffer, AdamElem e, int64_t off, int64_t len, float* block, bool vector) {
  if (e == AdamElem::F32) return static_cast<float*>(buffer) + off;
  widen(static_cast<const uint16_t*>(buffer) + off, e, block, len, vector);
  return block;
}

struct Job {
  AdamBuffers b;
  const void* grad;
  AdamElem grad_format;
  uint16_t* copy16;
  Half16Kind copy_kind;
  detail::AdamConsts c;
  detail::AdamKernel kernel;
  // With the scalar kernel (DS_ADAM_ISA=scalar, or a CPU without AVX2) the conversions are scalar
  // too; else 8 at a time (an AVX-512 CPU has AVX2 and F16C). Chosen once per call.
  bool vector_conversions;
};

// Elements [off, off + len) of the job, len <= kBlock.
void run_block(const Job& j, int64_t off, int64_t len) {
  alignas(64) float wide_p[kBlock], wide_g[kBlock], wide_m[kBlock], wide_v[kBlock];
  const AdamBuffers& b = j.b;
  const bool vec = j.vector_conversions;
  float* p = fp32_view(b.param, b.param_format, off, len, wide_p, vec);
  const float* g = fp32_view(const_cast<void*>(j.grad), j.grad_format, off, len, wide_g, vec);
  float* m = fp32_view(b.exp_avg, b.moment_format, off, len, wide_m, vec);
  float* v = fp32_view(b.exp_avg_sq, b.moment_format, off, len, wide_v, vec);
  const bool master16 = b.param_format != AdamElem::F32;
  // A 16-bit master takes the kernel's 16-bit store of the update: its own rounding.
  uint16_t* out16 = master16 ? static_cast<uint16_t*>(b.param) + off
                             : (j.copy16 != nullptr ? j.copy16 + off : nullptr);
  const Half16Kind out_kind =
      master16 ? (b.param_format == AdamElem::FP16 ? Half16Kind::FP16 : Half16Kind::BF16)
               : j.copy_kind;
  j.kernel(p, g, m, v, len, j.c, out16, out_kind);
  if (master16 && j.copy16 != nullptr) {
    if (elem_of(j.copy_kind) == b.param_format)
      std::memcpy(j.copy16 + off, out16, static_cast<size_t>(len) * 2);
    else
      narrow(p, elem_of(j.copy_kind), j.copy16 + off, len, vec);
  }
  if (b.moment_format != AdamElem::F32) {
    narrow(m, b.moment_format, static_cast<uint16_t*>(b.exp_avg) + off, len, vec);
    narrow(v, b.moment_format, static_cast<uint16_t*>(b.exp_avg_sq) + off, len, vec);
  }
}

void run_chunk(const Job& j, int64_t off, int64_t len) {
  for (int64_t at = off, end = off + len; at < end; at += kBlock)
    run_block(j, at, std::min(kBlock, end - at));
}

}  // namespace

AdamBuffers AdamBuffers::at(int64_t k) const {
  AdamBuffers b = *this;
  b.param = advance(param, param_format, k);
  b.exp_avg = advance(exp_avg, moment_format, k);
  b.exp_avg_sq = advance(exp_avg_sq, moment_format, k);
  return b;
}

void adam_step_buffers(const AdamBuffers& b, const void* grad, AdamElem grad_format, int64_t n,
                       const AdamStepParams& p, uint16_t* copy16, Half16Kind copy_kind) {
  if (b.moment_format == AdamElem::FP16)
    throw std::invalid_argument("adam_step_buffers: fp16 moments are not supported (fp32, bf16)");
  const bool fp32_state = b.param_format == AdamElem::F32 && b.moment_format == AdamElem::F32;
  // The formats adam_step and adam_step_bf16_grad cover: their paths, unchanged.
  if (fp32_state && grad_format == AdamElem::F32)
    return adam_step(static_cast<float*>(b.param), static_cast<const float*>(grad),
                     static_cast<float*>(b.exp_avg), static_cast<float*>(b.exp_avg_sq), n, p,
                     copy16, copy_kind);
  if (fp32_state && grad_format == AdamElem::BF16)
    return adam_step_bf16_grad(static_cast<float*>(b.param), static_cast<const uint16_t*>(grad),
                               static_cast<float*>(b.exp_avg), static_cast<float*>(b.exp_avg_sq), n,
                               p, copy16, copy_kind);
  if (n < 0) throw std::invalid_argument("adam_step: n=" + std::to_string(n) + " < 0");
  const Job job{b,
                grad,
                grad_format,
                copy16,
                copy_kind,
                detail::make_adam_consts(p),
                detail::current_kernel(),
                detail::current_adam_isa() != AdamIsa::Scalar};
  if (n == 0) return;
  const int threads = detail::adam_thread_count(p);
  if (threads <= 1 || n < detail::kAdamParallelMin) return run_chunk(job, 0, n);
  const int64_t chunk = detail::kAdamChunk, chunks = (n + chunk - 1) / chunk;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t k = 0; k < chunks; ++k) run_chunk(job, k * chunk, std::min(chunk, n - k * chunk));
}

}  // namespace deepspeed::optim
