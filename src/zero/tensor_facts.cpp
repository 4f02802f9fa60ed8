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

// Chunks of 2^18 elements on the CPU (the widened chunk stays in cache); on a GPU 2^24 (256 MiB
// of transients), so a billion-element partition is ~60 chunks, not thousands of launches.
at::Tensor sum_of_squares(const at::Tensor& t) {
  if (!t.defined()) return at::zeros({}, at::kDouble);
  at::Tensor sum = at::zeros({}, t.options().dtype(at::kDouble));
  const int64_t chunk = t.is_cpu() ? int64_t{1} << 18 : int64_t{1} << 24;
  const at::Tensor flat = t.reshape({-1});
  const int64_t n = flat.numel();
  for (int64_t c = 0; c < n; c += chunk)
    sum += flat.narrow(0, c, std::min(chunk, n - c)).to(at::kDouble).pow(2).sum();
  return sum;
}

}  // namespace zero
}  // namespace deepspeed
