#include <algorithm>
#include <cstdio>
#include <string>

#include "deepspeed/errors.h"
#include "deepspeed/memory.h"

namespace deepspeed {

MemoryEstimate estimate_zero_memory(int64_t psi, int n, int stage, bool mixed_precision,
                                    int hpz_partition_size, int64_t largest_layer_params,
                                    int grad_accum_bytes, bool widening_step,
                                    int accumulation_steps) {
  if (psi < 0 || n < 1 || stage < 0 || stage > 3)
    throw ConfigError(
        "estimate_zero_memory: need parameters >= 0, world size >= 1, stage 0..3; got " +
        std::to_string(psi) + ", " + std::to_string(n) + ", " + std::to_string(stage));
  const int hpz = std::min(hpz_partition_size, n);  // as zero/stage3/zeropp_options.cpp reads it
  if (hpz < 1 || n % hpz != 0)
    throw ConfigError("estimate_zero_memory: zero_optimization.zero_hpz_partition_size " +
                      std::to_string(hpz_partition_size) +
                      " must be >= 1 and divide the world size " + std::to_string(n));
  if (largest_layer_params < 0 || largest_layer_params > psi)
    throw ConfigError("estimate_zero_memory: largest_layer_params " +
                      std::to_string(largest_layer_params) + " must be in 0.." +
                      std::to_string(psi) + " (the parameter count)");
  if (accumulation_steps < 1)
    throw ConfigError("estimate_zero_memory: accumulation_steps " +
                      std::to_string(accumulation_steps) + " must be >= 1");
  const int64_t weight_bytes = mixed_precision ? 2 : 4;
  if (grad_accum_bytes != 0 && grad_accum_bytes != 2 && grad_accum_bytes != 4)
    throw ConfigError("estimate_zero_memory: grad_accum_bytes " + std::to_string(grad_accum_bytes) +
                      " must be 0 (the weights' width), 2 or 4");
  if (grad_accum_bytes != 0 && grad_accum_bytes < weight_bytes)
    throw ConfigError("estimate_zero_memory: grad_accum_bytes " + std::to_string(grad_accum_bytes) +
                      " is narrower than the " + std::to_string(weight_bytes) +
                      "-byte weights (initialize() refuses such a data_types.grad_accum_dtype)");
  // The gradients the stage keeps, in their accumulation width (memory.h).
  const int64_t grad_bytes = grad_accum_bytes != 0 ? grad_accum_bytes : weight_bytes;
  const int64_t optim_bytes = mixed_precision ? 12 : 8;  // mixed: fp32 master + 2 moments
  auto part = [](int64_t total, int64_t ways) { return (total + ways - 1) / ways; };
  MemoryEstimate e;
  e.parameters = stage >= 3 ? part(weight_bytes * psi, n) : weight_bytes * psi;
  e.gradients = stage >= 2 ? part(grad_bytes * psi, n) : grad_bytes * psi;
  // Stage 1 reduce-scatters at the boundary (memory.h), unless it accumulates wider than its
  // weights: then it all-reduces its full buffer, as above.
  const bool accumulating = accumulation_steps > 1;
  if (stage == 1 && !(accumulating && grad_bytes > weight_bytes))
    e.gradients = part(grad_bytes * psi, n) + (accumulating ? weight_bytes * psi : 0);
  e.optimizer_states = stage >= 1 ? part(optim_bytes * psi, n) : optim_bytes * psi;
  // hpZ: 1/hpz of every gathered unit, in the parameters' dtype (memory.h).
  if (stage == 3 && hpz > 1) e.hpz_secondary = part(weight_bytes * psi, hpz);
  // 16-bit gradients and a step that widens them: its fp32 copy of the gradient partition
  // (shard_optimizer.cpp). Stage 0 steps one replicated partition, all Ψ. fp32 gradients (an fp32
  // model, or fp32 accumulation) are stepped in place; Adam/AdamW reads 16-bit ones (memory.h).
  if (grad_bytes < 4 && widening_step) e.step_transient = stage >= 1 ? part(4 * psi, n) : 4 * psi;
  // Left out: the gradient norm's scratch (zero/tensor_facts.cpp's sum_of_squares: none for a
  // contiguous partition in host memory, else at most 4 MiB on the CPU; on a GPU the norm kernel
  // holds only its result). Bounded whatever Ψ; docs/monitoring.md says so.
  // Stage 3: the largest unit whole, weights gathered and gradient before its reduce-scatter.
  // (Its gradient as autograd produces it, in the weights' dtype, whatever the accumulation's.)
  if (stage == 3) e.largest_layer_working = 2 * weight_bytes * largest_layer_params;
  return e;
}

std::string format_zero_memory_estimates(int64_t psi, int n, bool mixed_precision,
                                         int hpz_partition_size, int64_t largest_layer_params,
                                         int grad_accum_bytes) {
  const bool hpz = hpz_partition_size > 1;
  // MB = 2^20 bytes, as see_memory_usage's "model states (MB)" (monitor/memory_usage.cpp), so
  // the two can be read side by side.
  auto mb = [](int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); };
  std::string out;
  char line[320];
  const bool fp32_accumulation = mixed_precision && grad_accum_bytes == 4;
  std::snprintf(line, sizeof line,
                "Estimated model-state memory per rank: %lld parameters, %d ranks, %s, Adam%s%s\n",
                static_cast<long long>(psi), n,
                !mixed_precision    ? "fp32"
                : fp32_accumulation ? "mixed precision with fp32 gradient accumulation"
                                    : "mixed precision",
                hpz ? (", hpZ groups of " + std::to_string(hpz_partition_size)).c_str() : "",
                largest_layer_params > 0
                    ? (", largest layer " + std::to_string(largest_layer_params)).c_str()
                    : "");
  out += line;
  // Adam/AdamW's step reads 16-bit gradients as they are: no fp32 copy of them in peak.
  std::string transients;
  if (largest_layer_params > 0) transients = "stage 3's largest layer";
  if (hpz) transients += (transients.empty() ? "" : " and ") + std::string("hpZ's secondary partition");
  out += "  (MB = 2^20 bytes";
  out += transients.empty() ? ")\n" : "; peak adds " + transients + ")\n";
  out += hpz ? "  stage | parameters (MB) | gradients (MB) | optimizer (MB) | hpZ secondary (MB) | "
               "model states (MB) | peak (MB)\n"
             : "  stage | parameters (MB) | gradients (MB) | optimizer (MB) | model states (MB) | "
               "peak (MB)\n";
  for (int stage = 0; stage < 4; ++stage) {
    auto e = estimate_zero_memory(psi, n, stage, mixed_precision, hpz_partition_size,
                                  largest_layer_params, grad_accum_bytes);
    if (hpz)
      std::snprintf(line, sizeof line,
                    "  %5d | %15.1f | %14.1f | %14.1f | %18.1f | %17.1f | %9.1f\n", stage,
                    mb(e.parameters), mb(e.gradients), mb(e.optimizer_states),
                    mb(e.hpz_secondary), mb(e.model_states()), mb(e.peak()));
    else
      std::snprintf(line, sizeof line, "  %5d | %15.1f | %14.1f | %14.1f | %17.1f | %9.1f\n",
                    stage, mb(e.parameters), mb(e.gradients), mb(e.optimizer_states),
                    mb(e.model_states()), mb(e.peak()));
    out += line;
  }
  return out;
}

}  // namespace deepspeed
