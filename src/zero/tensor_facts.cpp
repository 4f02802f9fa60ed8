#include "zero/tensor_facts.h"

#include <ATen/ATen.h>
#include <c10/core/ScalarType.h>

#include <algorithm>

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

// Chunks of 2^18 elements on the CPU (the widened chunk stays in cache), each widened to fp64.
// On a GPU, chunks of 2^24 (a billion-element partition is ~60 launches), each one norm kernel
// that reads the chunk once and accumulates in fp32, as DeepSpeed's and PyTorch's gradient norms
// do; the chunks' squares add up in fp64. Widening there cost a pass writing 8 bytes an element,
// a pow pass and a sum pass (~36 bytes an element against 4: ~10 ms of a 150 ms ZeRO-2 step of
// a 1.31B model on an H200, docs/benchmarks.md "GPU"). fp32 squares overflow past |g| ~1.8e19,
// where the step is an overflow anyway.
at::Tensor sum_of_squares(const at::Tensor& t) {
  if (!t.defined()) return at::zeros({}, at::kDouble);
  at::Tensor sum = at::zeros({}, t.options().dtype(at::kDouble));
  const bool on_cpu = t.is_cpu();
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
