// DeepSpeed's flops-profiler formulas (deepspeed/profiling/flops_profiler/profiler.py), keyed by
// the ATen operator that a torch.nn.functional / torch call of DeepSpeed's list ends up as. Pure
// functions of the operator's inputs (and, for convolutions, its output's size): the recorder in
// flops_profiler.cpp calls them, tests call them directly.
#pragma once
#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>

namespace deepspeed {
namespace profiling {

struct OpCount {
  bool counted = false;  // the operator has a formula (even one giving 0, as embedding's)
  int64_t flops = 0;
  int64_t macs = 0;
  // Convolutions: what depends on the output, added once its size is known (finish()).
  int64_t macs_per_output = 0;   // MACs per output element
  bool bias_per_output = false;  // + one FLOP per output element
};

// The count for operator `name` ("aten::linear") on `inputs`; counted == false when DeepSpeed has
// no formula for it.
OpCount count_operator(const char* name, c10::ArrayRef<const c10::IValue> inputs);
// Adds the output-dependent part (convolutions) for an output of `output_numel` elements.
void finish(OpCount& count, int64_t output_numel);

}  // namespace profiling
}  // namespace deepspeed
