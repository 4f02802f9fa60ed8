// How gradients are averaged over the data-parallel group, exactly once (DeepSpeed semantics):
//   prescale_gradients = true : g *= 1/W before the sum
//   otherwise                 : g *= 1/f before the sum, then *= f/W after  (f = gradient_predivide_factor)
// Pre-dividing keeps fp16 sums from overflowing; the result is the mean either way. When the sum
// itself runs in fp16 (an fp16 all-reduce: Gloo adds in fp16) and the user chose neither option,
// the mean is taken before the sum (g/W summed), so W large gradients cannot overflow where their
// mean would not. bf16 and reduce-scatters are summed in fp32 by src/comm and need no such care.
#pragma once
#include "zero/stage_options.h"

namespace deepspeed {
namespace zero {

struct GradientScaling {
  double before_reduce = 1.0;
  double after_reduce = 1.0;
};

inline GradientScaling gradient_scaling(const ReductionOptions& options, int world_size,
                                        bool fp16_sum = false) {
  const double w = world_size;
  if (options.prescale) return {1.0 / w, 1.0};
  if (fp16_sum && options.predivide_factor == 1.0) return {1.0 / w, 1.0};
  const double f = options.predivide_factor;
  return {1.0 / f, f / w};
}

}  // namespace zero
}  // namespace deepspeed
