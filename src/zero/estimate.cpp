#include <algorithm>
#include <cstdio>
#include <string>

#include "deepspeed/errors.h"
#include "deepspeed/memory.h"

namespace deepspeed {

MemoryEstimate estimate_zero_memory(int64_t psi, int n, int stage, bool mixed_precision,
                                    int hpz_partition_size) {
  if (psi < 0 || n < 1 || stage < 0 || stage > 3)
    throw ConfigError(
        "estimate_zero_memory: need parameters >= 0, world size >= 1, stage 0..3; got " +
        std::to_string(psi) + ", " + std::to_string(n) + ", " + std::to_string(stage));
  const int hpz = std::min(hpz_partition_size, n);  // as zero/stage3/zeropp_options.cpp reads it
  if (hpz < 1 || n % hpz != 0)
    throw ConfigError("estimate_zero_memory: zero_optimization.zero_hpz_partition_size " +
                      std::to_string(hpz_partition_size) +
                      " must be >= 1 and divide the world size " + std::to_string(n));
  const int64_t weight_bytes = mixed_precision ? 2 : 4;
  const int64_t grad_bytes = mixed_precision ? 2 : 4;
  const int64_t optim_bytes = mixed_precision ? 12 : 8;  // mixed: fp32 master + 2 moments
  auto part = [](int64_t total, int64_t ways) { return (total + ways - 1) / ways; };
  MemoryEstimate e;
  e.parameters = stage >= 3 ? part(weight_bytes * psi, n) : weight_bytes * psi;
  e.gradients = stage >= 2 ? part(grad_bytes * psi, n) : grad_bytes * psi;
  e.optimizer_states = stage >= 1 ? part(optim_bytes * psi, n) : optim_bytes * psi;
  // hpZ: 1/hpz of every gathered unit, in the parameters' dtype (memory.h).
  if (stage == 3 && hpz > 1) e.hpz_secondary = part(weight_bytes * psi, hpz);
  return e;
}

std::string format_zero_memory_estimates(int64_t psi, int n, bool mixed_precision,
                                         int hpz_partition_size) {
  const bool hpz = hpz_partition_size > 1;
  std::string out;
  char line[240];
  std::snprintf(line, sizeof line,
                "Estimated model-state memory per rank: %lld parameters, %d ranks, %s, Adam%s\n",
                static_cast<long long>(psi), n, mixed_precision ? "mixed precision" : "fp32",
                hpz ? (", hpZ groups of " + std::to_string(hpz_partition_size)).c_str() : "");
  out += line;
  out += hpz ? "  stage | parameters (MB) | gradients (MB) | optimizer (MB) | hpZ secondary (MB) | "
               "total (MB)\n"
             : "  stage | parameters (MB) | gradients (MB) | optimizer (MB) | total (MB)\n";
  for (int stage = 0; stage < 4; ++stage) {
    auto e = estimate_zero_memory(psi, n, stage, mixed_precision, hpz_partition_size);
    if (hpz)
      std::snprintf(line, sizeof line, "  %5d | %15.1f | %14.1f | %14.1f | %18.1f | %10.1f\n",
                    stage, e.parameters / 1e6, e.gradients / 1e6, e.optimizer_states / 1e6,
                    e.hpz_secondary / 1e6, e.peak() / 1e6);
    else
      std::snprintf(line, sizeof line, "  %5d | %15.1f | %14.1f | %14.1f | %10.1f\n", stage,
                    e.parameters / 1e6, e.gradients / 1e6, e.optimizer_states / 1e6,
                    e.model_states() / 1e6);
    out += line;
  }
  return out;
}

}  // namespace deepspeed
