// Adam step: constants, ISA choice, OpenMP split, and the scalar kernel (the reference the SIMD
// kernels must equal bit for bit, and their tail).
#include "optim/cpu_adam.h"

#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "optim/cpu_adam_kernels.h"

// Every path must round the same way: no compiler-fused multiply-adds beyond the explicit fmaf
// calls, even when the library is built with -march=native. (Pushed, and popped at the end: in
// a unity batch the files after this one keep their own setting.)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")

namespace deepspeed::optim {
namespace detail {

void adam_kernel_scalar(float* param, const float* grad, float* m, float* v, int64_t n,
                        const AdamConsts& c, uint16_t* param16, Half16Kind kind) {
  for (int64_t i = 0; i < n; ++i) {
    float p = param[i], mi = m[i], vi = v[i];
    adam_update(grad[i], p, mi, vi, c);
    m[i] = mi;
    v[i] = vi;
    param[i] = p;
    if (param16 != nullptr) {
      param16[i] = kind == Half16Kind::BF16 ? float_to_bf16_bits(p) : c10::Half(p).x;
    }
  }
}

}  // namespace detail

namespace {

using detail::AdamConsts;

// Chunk of the OpenMP split: large enough to amortise the loop overhead, a multiple of every
// vector width, and small enough that 2 threads get balanced work from a few-MB partition.
constexpr int64_t kChunk = detail::kAdamChunk;
constexpr int64_t kParallelMin = detail::kAdamParallelMin;

bool cpu_has(AdamIsa isa) {
  switch (isa) {
    case AdamIsa::Scalar:
      return true;
    case AdamIsa::Avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case AdamIsa::Avx512:
      return __builtin_cpu_supports("avx512f");
  }
  return false;
}

const char* isa_name(AdamIsa isa) {
  switch (isa) {
    case AdamIsa::Avx512: return "avx512";
    case AdamIsa::Avx2: return "avx2";
    case AdamIsa::Scalar: return "scalar";
  }
  return "scalar";
}

AdamIsa best_isa() {
  if (cpu_has(AdamIsa::Avx512)) return AdamIsa::Avx512;
  if (cpu_has(AdamIsa::Avx2)) return AdamIsa::Avx2;
  return AdamIsa::Scalar;
}

AdamIsa parse_isa(const std::string& s) {
  if (s == "scalar") return AdamIsa::Scalar;
  if (s == "avx2") return AdamIsa::Avx2;
  if (s == "avx512") return AdamIsa::Avx512;
  throw std::invalid_argument("DS_ADAM_ISA='" + s + "': expected scalar, avx2 or avx512");
}

void require_supported(AdamIsa isa, const char* origin) {
  if (!cpu_has(isa)) {
    throw std::invalid_argument(std::string(origin) + ": CPU lacks the instructions for the " +
                                isa_name(isa) + " Adam kernel");
  }
}

AdamIsa initial_isa() {
  const char* env = std::getenv("DS_ADAM_ISA");
  if (env == nullptr || *env == '\0') return best_isa();
  const AdamIsa isa = parse_isa(env);
  require_supported(isa, "DS_ADAM_ISA");
  return isa;
}

std::atomic<AdamIsa>& current_isa() {
  static std::atomic<AdamIsa> isa{initial_isa()};
  return isa;
}

detail::AdamKernel kernel_for(AdamIsa isa) {
  switch (isa) {
    case AdamIsa::Avx512: return detail::adam_kernel_avx512;
    case AdamIsa::Avx2: return detail::adam_kernel_avx2;
    case AdamIsa::Scalar: return detail::adam_kernel_scalar;
  }
  return detail::adam_kernel_scalar;
}

}  // namespace

AdamConsts detail::make_adam_consts(const AdamStepParams& p) {
  if (p.bias_correction && p.step < 1) {
    throw std::invalid_argument("adam_step: step=" + std::to_string(p.step) +
                                " but bias correction needs step >= 1");
  }
  const double lr = p.lr, b1 = p.beta1, b2 = p.beta2, wd = p.weight_decay;
  const double step = static_cast<double>(p.step);
  const double bc1 = p.bias_correction ? 1.0 - std::pow(b1, step) : 1.0;
  const double bc2 = p.bias_correction ? 1.0 - std::pow(b2, step) : 1.0;
  AdamConsts c{};
  c.grad_scale = p.grad_scale;
  c.decay_mul = static_cast<float>(1.0 - lr * wd);
  c.l2 = p.weight_decay;
  c.beta1 = p.beta1;
  c.one_minus_beta1 = static_cast<float>(1.0 - b1);
  c.beta2 = p.beta2;
  c.one_minus_beta2 = static_cast<float>(1.0 - b2);
  c.sqrt_bc2 = static_cast<float>(std::sqrt(bc2));
  c.eps = p.eps;
  c.neg_step_size = static_cast<float>(-(lr / bc1));
  c.scale_grad = p.grad_scale != 1.0f;
  c.decoupled_decay = p.adamw_mode && p.weight_decay != 0.0f;
  c.l2_decay = !p.adamw_mode && p.weight_decay != 0.0f;
  return c;
}

namespace {

int thread_count(const AdamStepParams& p) {
#ifdef _OPENMP
  return p.num_threads > 0 ? p.num_threads : omp_get_max_threads();
#else
  return 1;
#endif
}

}  // namespace

void adam_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
               const AdamStepParams& p, uint16_t* param16, Half16Kind kind) {
  if (n < 0) throw std::invalid_argument("adam_step: n=" + std::to_string(n) + " < 0");
  const AdamConsts c = detail::make_adam_consts(p);
  if (n == 0) return;
  const detail::AdamKernel kernel = kernel_for(current_isa().load(std::memory_order_relaxed));
  const int threads = thread_count(p);
  if (threads <= 1 || n < kParallelMin) {
    kernel(param, grad, exp_avg, exp_avg_sq, n, c, param16, kind);
    return;
  }
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  // schedule(static) hands each thread one contiguous run of chunks: the same pages every step,
  // which keeps first-touch NUMA placement useful.
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t off = k * kChunk;
    const int64_t len = std::min(kChunk, n - off);
    kernel(param + off, grad + off, exp_avg + off, exp_avg_sq + off, len, c,
           param16 != nullptr ? param16 + off : nullptr, kind);
  }
}

void adam_step_bf16_grad(float* param, const uint16_t* grad_bf16, float* exp_avg,
                         float* exp_avg_sq, int64_t n, const AdamStepParams& p, uint16_t* param16,
                         Half16Kind kind) {
  if (n < 0) throw std::invalid_argument("adam_step: n=" + std::to_string(n) + " < 0");
  const AdamConsts c = detail::make_adam_consts(p);
  if (n == 0) return;
  const AdamIsa isa = current_isa().load(std::memory_order_relaxed);
  const detail::AdamKernel kernel = kernel_for(isa);
  const auto widen = isa == AdamIsa::Avx512 ? detail::widen_bf16_avx512 : detail::widen_bf16_scalar;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  // One chunk: its gradients widened into `wide`, 128 KiB on the thread's stack, then the kernel
  // on them while they are in cache.
  auto one = [&](int64_t k, float* wide) {
    const int64_t off = k * kChunk;
    const int64_t len = std::min(kChunk, n - off);
    widen(grad_bf16 + off, wide, len);
    kernel(param + off, wide, exp_avg + off, exp_avg_sq + off, len, c,
           param16 != nullptr ? param16 + off : nullptr, kind);
  };
  const int threads = thread_count(p);
  if (threads <= 1 || n < kParallelMin) {
    alignas(64) float wide[kChunk];
    for (int64_t k = 0; k < chunks; ++k) one(k, wide);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    alignas(64) float wide[kChunk];
#pragma omp for schedule(static)
    for (int64_t k = 0; k < chunks; ++k) one(k, wide);
  }
}

detail::AdamKernel detail::current_kernel() {
  return kernel_for(current_isa().load(std::memory_order_relaxed));
}

AdamIsa detail::current_adam_isa() { return current_isa().load(std::memory_order_relaxed); }

int detail::adam_thread_count(const AdamStepParams& p) { return thread_count(p); }

const char* adam_kernel_isa() { return isa_name(current_isa().load()); }

bool adam_isa_supported(AdamIsa isa) { return cpu_has(isa); }

void set_adam_isa(AdamIsa isa) {
  require_supported(isa, "set_adam_isa");
  current_isa().store(isa);
}

void reset_adam_isa() { current_isa().store(best_isa()); }

}  // namespace deepspeed::optim

#pragma GCC pop_options
