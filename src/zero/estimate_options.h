// The estimator's positional public forms (memory.h) as a ZeroMemoryOptions: one place that maps
// the argument list onto the fields, for estimate_zero_memory and format_zero_memory_estimates.
#pragma once

#include <cstdint>

#include "deepspeed/memory.h"

namespace deepspeed {

ZeroMemoryOptions positional_zero_memory_options(int world_size, int stage, bool mixed_precision,
                                                 int hpz_partition_size,
                                                 int64_t largest_layer_params, int grad_accum_bytes,
                                                 bool widening_step = false,
                                                 int accumulation_steps = 1);

}  // namespace deepspeed
