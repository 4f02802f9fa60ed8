// Expected model-state bytes per rank before training, like DeepSpeed's
// estimate_zero2_model_states_mem_needs_all_live / estimate_zero3_...: the ZeRO paper's formulas
// for Ψ parameters over N data-parallel ranks with Adam (two fp32 moments).
//   fp32:            weights 4Ψ, gradients 4Ψ, moments 8Ψ (the weight partition doubles as master)
//   mixed precision: 16-bit weights 2Ψ, 16-bit gradients 2Ψ, fp32 master 4Ψ + moments 8Ψ (K = 12)
// Stage s partitions: 1 → optimizer states, 2 → + gradients, 3 → + weights.
#pragma once
#include <cstdint>
#include <string>

namespace deepspeed {

struct MemoryEstimate {
  int64_t parameters = 0;        // bytes per rank
  int64_t gradients = 0;
  int64_t optimizer_states = 0;  // moments (+ fp32 master weights in mixed precision)
  int64_t model_states() const { return parameters + gradients + optimizer_states; }
};

// REQUIRES: num_parameters >= 0, world_size >= 1, 0 <= stage <= 3.
MemoryEstimate estimate_zero_memory(int64_t num_parameters, int world_size, int stage,
                                    bool mixed_precision = false);
// A table of all four stages for a model, as printed by the estimator (one line per stage).
std::string format_zero_memory_estimates(int64_t num_parameters, int world_size,
                                         bool mixed_precision = false);

}  // namespace deepspeed
