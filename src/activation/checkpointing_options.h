// Process-wide state of deepspeed::checkpointing shared by the autograd function and configure():
// the options and the counters (under one mutex: dist tests run ranks as threads of one process).
#pragma once
#include <cstdint>

#include "deepspeed/checkpointing.h"

namespace deepspeed {
namespace checkpointing {
namespace detail {

// Counts a new checkpoint holding `bytes` of saved inputs. Throws ConfigError naming
// activation_checkpointing.number_checkpoints when contiguous_memory_optimization caps the count
// and this forward exceeds it.
void on_saved(int64_t bytes);
// The saved inputs of a checkpoint were dropped (recomputed, or the graph was freed unused).
void on_released(int64_t bytes);
void add_forward_time(double seconds);
// Counts one recomputation (seconds: 0 unless profiled).
void add_recompute_time(double seconds);

}  // namespace detail
}  // namespace checkpointing
}  // namespace deepspeed
