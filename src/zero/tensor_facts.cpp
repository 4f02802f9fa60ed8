#include "zero/tensor_facts.h"

#include <c10/core/ScalarType.h>

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

}  // namespace zero
}  // namespace deepspeed
