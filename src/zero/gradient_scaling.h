// How gradients are averaged over the data-parallel group, exactly once (DeepSpeed semantics):
//   prescale_gradients = true : g *= 1/W before the sum
//   otherwise                 : g *= 1/f before the sum, then *= f/W after  (f = gradient_predivide_factor)
// Pre-dividing keeps fp16 sums from overflowing; the result is the mean either way. In fp16 the
// sum of W gradients can exceed 65504 (inf) where their mean would not, so when the user chose
// neither option the mean is taken before anything is rounded to fp16:
//   - an fp16 all-reduce (Gloo adds fp16 in fp16): g/W summed (gradient_scaling, fp16_sum);
//   - an fp16 reduce-scatter: every communicator's reduce_scatter_v sums in fp32 but rounds the
//     result to the bucket's fp16, so the collective takes the mean itself (ReduceOp::Avg: the
//     fp32 sum divided by W, rounded once) and nothing is multiplied after
//     (reduce_scatter_scaling); a reduction that can only sum (qgZ) gets g/W instead.
// DeepSpeed's average_tensor divides by the world size before the reduce in every dtype. bf16
// (fp32's range) and fp32 are summed, then multiplied by 1/W.
#pragma once
#include "deepspeed/comm.h"
#include "zero/stage_options.h"

namespace deepspeed {
namespace zero {

struct GradientScaling {
  double before_reduce = 1.0;
  double after_reduce = 1.0;
  comm::ReduceOp op = comm::ReduceOp::Sum;  // what the collective computes
};

inline GradientScaling gradient_scaling(const ReductionOptions& options, int world_size,
                                        bool fp16_sum = false) {
  const double w = world_size;
  if (options.prescale) return {1.0 / w, 1.0};
  if (fp16_sum && options.predivide_factor == 1.0) return {1.0 / w, 1.0};
  const double f = options.predivide_factor;
  return {1.0 / f, f / w};
}

// For a reduce-scatter of gradients travelling in `comm_dtype`. `avg_supported`: the collective
// takes ReduceOp::Avg (false for qgZ's quantized reduce-scatter, which sums).
inline GradientScaling reduce_scatter_scaling(const ReductionOptions& options, int world_size,
                                              at::ScalarType comm_dtype,
                                              bool avg_supported = true) {
  const bool fp16 = comm_dtype == at::kHalf;
  if (fp16 && avg_supported && !options.prescale && options.predivide_factor == 1.0)
    return {1.0, 1.0, comm::ReduceOp::Avg};
  return gradient_scaling(options, world_size, fp16);
}

}  // namespace zero
}  // namespace deepspeed
