// Model-state memory: what a rank holds (MemoryReport, from Engine::memory_report()) and what the
// ZeRO formulas expect before training (estimate_zero_memory).
#pragma once
#include <cstdint>
#include <string>

namespace deepspeed {

// Model-state bytes held by this rank, measured from the real tensor storages.
struct MemoryReport {
  int64_t parameters = 0;        // model parameters as the module holds them (+ master copies)
  int64_t gradients = 0;         // gradient storage
  int64_t optimizer_states = 0;  // optimizer moments (and fp32 masters when kept separately)
  int64_t comm_buffers = 0;      // bucket / gather buffers (stage 3: peak gradient buckets)
  // Of comm_buffers, in host memory on a GPU: page-locked copies of gradient buckets on their way
  // into a pageable offloaded partition (peak). Also counted in host_bytes.
  int64_t host_comm_buffers = 0;
  // ZeRO stage 3's gathered working set, beside model_states(): the full parameters gathered now
  // and the high-water mark since initialize(). *_numel: units only (what
  // stage3_max_live_parameters bounds); *_bytes: every gathered buffer, the root unit included.
  int64_t gathered_numel = 0;
  int64_t peak_gathered_numel = 0;
  int64_t gathered_bytes = 0;
  int64_t peak_gathered_bytes = 0;
  // Of total(): the bytes in host memory; the rest is in the compute device's memory. On the
  // CPU that is everything; on a GPU, what offload keeps on the host (ZeRO-Offload's masters,
  // moments and pinned buffers; offload_param's partition; swap buffers).
  int64_t host_bytes = 0;
  int64_t model_states() const { return parameters + gradients + optimizer_states; }
  int64_t total() const { return model_states() + comm_buffers + gathered_bytes; }
  int64_t device_bytes() const { return total() - host_bytes; }
};

// Expected model-state bytes per rank before training, like DeepSpeed's
// estimate_zero2_model_states_mem_needs_all_live / estimate_zero3_...: the ZeRO paper's formulas
// for Ψ parameters over N data-parallel ranks with Adam (two fp32 moments).
//   fp32:            weights 4Ψ, gradients 4Ψ, moments 8Ψ (the weight partition doubles as master)
//   mixed precision: 16-bit weights 2Ψ, 16-bit gradients 2Ψ, fp32 master 4Ψ + moments 8Ψ (K = 12)
// Stage s partitions: 1 → optimizer states, 2 → + gradients, 3 → + weights.
// ZeRO++'s hpZ (stage 3, zero_optimization.zero_hpz_partition_size = h > 1) adds a secondary
// partition: each rank keeps 1/h of every unit it gathered in the forward pass, so the backward
// gather stays inside its group of h ranks. Held from a unit's forward to its backward, all units
// at once at the end of the forward pass: weight bytes · Ψ / h at that peak (2Ψ/h in 16 bits, the
// ZeRO++ paper's figure; 4Ψ/h in fp32). Measured, it is part of MemoryReport::gathered_bytes,
// not of model_states(); here it is its own field, in peak() and not in model_states().
// DeepSpeed's estimate_zero3_model_states_mem_needs takes no hpZ argument and leaves it out.
struct MemoryEstimate {
  int64_t parameters = 0;        // bytes per rank
  int64_t gradients = 0;
  int64_t optimizer_states = 0;  // moments (+ fp32 master weights in mixed precision)
  int64_t hpz_secondary = 0;     // hpZ's secondary partition at its peak (0 without hpZ)
  int64_t model_states() const { return parameters + gradients + optimizer_states; }
  int64_t peak() const { return model_states() + hpz_secondary; }
};

// hpz_partition_size: zero_optimization.zero_hpz_partition_size (1: no hpZ; counted at stage 3
// only; above world_size it means world_size, as the engine reads it).
// REQUIRES: num_parameters >= 0, world_size >= 1, 0 <= stage <= 3, hpz_partition_size >= 1
// dividing world_size. Throws ConfigError naming the value otherwise.
MemoryEstimate estimate_zero_memory(int64_t num_parameters, int world_size, int stage,
                                    bool mixed_precision = false, int hpz_partition_size = 1);
// A table of all four stages for a model, as printed by the estimator (one line per stage; with
// hpZ a column for its secondary partition, which the total then includes).
std::string format_zero_memory_estimates(int64_t num_parameters, int world_size,
                                         bool mixed_precision = false, int hpz_partition_size = 1);

}  // namespace deepspeed
