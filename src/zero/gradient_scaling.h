// How gradients are averaged over the data-parallel group, exactly once (DeepSpeed semantics):
//   prescale_gradients = true : g *= 1/W before the sum
//   otherwise                 : g *= 1/f before the sum, then *= f/W after  (f = gradient_predivide_factor)
// Pre-dividing keeps fp16 sums from overflowing; the result is the mean either way.
#pragma once
#include "deepspeed/config.h"

namespace deepspeed {
namespace zero {

struct GradientScaling {
  double before_reduce = 1.0;
  double after_reduce = 1.0;
};

inline GradientScaling gradient_scaling(const Config& config, int world_size) {
  const double w = world_size;
  if (config.prescale_gradients) return {1.0 / w, 1.0};
  const double f = config.gradient_predivide_factor;
  return {1.0 / f, f / w};
}

}  // namespace zero
}  // namespace deepspeed
