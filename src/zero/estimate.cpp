#include <cstdio>
#include <string>

#include "deepspeed/errors.h"
#include "deepspeed/memory.h"

namespace deepspeed {

MemoryEstimate estimate_zero_memory(int64_t psi, int n, int stage, bool mixed_precision) {
  if (psi < 0 || n < 1 || stage < 0 || stage > 3)
    throw ConfigError("estimate_zero_memory: need parameters >= 0, world size >= 1, stage 0..3; got " +
                      std::to_string(psi) + ", " + std::to_string(n) + ", " + std::to_string(stage));
  const int64_t weight_bytes = mixed_precision ? 2 : 4;
  const int64_t grad_bytes = mixed_precision ? 2 : 4;
  const int64_t optim_bytes = mixed_precision ? 12 : 8;  // mixed: fp32 master + 2 moments
  auto part = [n](int64_t total) { return (total + n - 1) / n; };
  MemoryEstimate e;
  e.parameters = stage >= 3 ? part(weight_bytes * psi) : weight_bytes * psi;
  e.gradients = stage >= 2 ? part(grad_bytes * psi) : grad_bytes * psi;
  e.optimizer_states = stage >= 1 ? part(optim_bytes * psi) : optim_bytes * psi;
  return e;
}

std::string format_zero_memory_estimates(int64_t psi, int n, bool mixed_precision) {
  std::string out;
  char line[200];
  std::snprintf(line, sizeof line,
                "Estimated model-state memory per rank: %lld parameters, %d ranks, %s, Adam\n",
                static_cast<long long>(psi), n, mixed_precision ? "mixed precision" : "fp32");
  out += line;
  out += "  stage | parameters (MB) | gradients (MB) | optimizer (MB) | total (MB)\n";
  for (int stage = 0; stage < 4; ++stage) {
    auto e = estimate_zero_memory(psi, n, stage, mixed_precision);
    std::snprintf(line, sizeof line, "  %5d | %15.1f | %14.1f | %14.1f | %10.1f\n", stage,
                  e.parameters / 1e6, e.gradients / 1e6, e.optimizer_states / 1e6,
                  e.model_states() / 1e6);
    out += line;
  }
  return out;
}

}  // namespace deepspeed
