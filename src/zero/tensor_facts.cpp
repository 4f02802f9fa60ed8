#include "zero/tensor_facts.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/ScalarType.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "deepspeed/errors.h"

namespace deepspeed {
namespace zero {

at::ScalarType uniform_param_dtype(int stage, const std::vector<at::Tensor>& params) {
  at::ScalarType dtype = params.empty() ? at::kFloat : params.front().scalar_type();
  for (auto& p : params) {
    auto t = p.scalar_type();
    if (t != dtype || (t != at::kFloat && t != at::kBFloat16 && t != at::kHalf))
      throw ConfigError("zero_optimization.stage " + std::to_string(stage) +
                        ": trainable parameters must all be fp32, or all bf16/fp16 (found " +
                        std::string(c10::toString(dtype)) + " and " +
                        std::string(c10::toString(t)) + ")");
  }
  return dtype;
}

at::ScalarType dtype_from_config(const std::string& configured, at::ScalarType fallback) {
  if (configured == "fp32") return at::kFloat;
  if (configured == "fp16") return at::kHalf;
  if (configured == "bf16") return at::kBFloat16;
  return fallback;
}

namespace {

// The sum of n squares in fp64, read in element order into eight independent sums (each square
// of a float is exact in fp64; the independent sums let the compiler keep them in vector lanes
// without reordering anything, so the result is the same on every machine and thread count).
template <typename T>
double squares_in_order(const T* x, int64_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) {
      const double v = static_cast<float>(x[i + j]);
      acc[j] += v * v;
    }
  double tail = 0;
  for (; i < n; ++i) {
    const double v = static_cast<float>(x[i]);
    tail += v * v;
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

// A contiguous fp32/bf16/fp16 tensor in host memory: one pass reading each element once, chunks
// of 2^18 spread over libtorch's intra-op threads and their sums added in chunk order (the same
// result with any thread count). No allocation: the tensor ops below widen each chunk to fp64,
// square it and sum it (three passes and two 2 MiB temporaries per chunk). On one core of this
// project's CI machine, 10M elements (a 20M-parameter partition's norm) took 5.4 ms in fp32 and
// 4.4 ms in bf16 that way, 1.9 and 2.5 ms here (docs/benchmarks.md, "Gradient norm in host memory").
template <typename T>
double host_squares(const T* x, int64_t n) {
  constexpr int64_t kChunk = int64_t{1} << 18;
  std::vector<double> parts((n + kChunk - 1) / kChunk, 0.0);
  at::parallel_for(0, static_cast<int64_t>(parts.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c)
      parts[c] = squares_in_order(x + c * kChunk, std::min(kChunk, n - c * kChunk));
  });
  double sum = 0;
  for (double p : parts) sum += p;
  return sum;
}

// A contiguous fp32/bf16/fp16 tensor in host memory: host_squares; nullopt for the rest.
std::optional<double> host_sum_of_squares(const at::Tensor& t) {
  if (!t.is_cpu() || !t.is_contiguous()) return std::nullopt;
  switch (t.scalar_type()) {
    case at::kFloat:
      return host_squares(t.data_ptr<float>(), t.numel());
    case at::kBFloat16:
      return host_squares(t.data_ptr<at::BFloat16>(), t.numel());
    case at::kHalf:
      return host_squares(t.data_ptr<at::Half>(), t.numel());
    default:
      return std::nullopt;
  }
}

}  // namespace

// On a GPU, chunks of 2^24 (a billion-element partition is ~60 launches), each one norm kernel
// that reads the chunk once and accumulates in fp32, as DeepSpeed's and PyTorch's gradient norms
// do; the chunks' squares add up in fp64. Widening there cost a pass writing 8 bytes an element,
// a pow pass and a sum pass (~36 bytes an element against 4: ~10 ms of a 150 ms ZeRO-2 step of
// a 1.31B model on an H200, docs/benchmarks.md "GPU"). fp32 squares overflow past |g| ~1.8e19,
// where the step is an overflow anyway. In host memory, host_squares above (other dtypes and
// strided tensors: chunks of 2^18 widened to fp64, the widened chunk staying in cache).
at::Tensor sum_of_squares(const at::Tensor& t) {
  if (!t.defined()) return at::zeros({}, at::kDouble);
  if (const auto host = host_sum_of_squares(t))
    return at::scalar_tensor(*host, at::TensorOptions().dtype(at::kDouble));
  const bool on_cpu = t.is_cpu();
  at::Tensor sum = at::zeros({}, t.options().dtype(at::kDouble));
  const int64_t chunk = on_cpu ? int64_t{1} << 18 : int64_t{1} << 24;
  const at::Tensor flat = t.reshape({-1});
  const int64_t n = flat.numel();
  for (int64_t c = 0; c < n; c += chunk) {
    const at::Tensor part = flat.narrow(0, c, std::min(chunk, n - c));
    if (on_cpu) {
      sum += part.to(at::kDouble).pow(2).sum();
    } else {
      sum += at::linalg_vector_norm(part, 2, c10::nullopt, false, at::kFloat)
                 .to(at::kDouble)
                 .square();
    }
  }
  return sum;
}

}  // namespace zero
}  // namespace deepspeed
