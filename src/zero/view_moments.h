// A one-moment optimizer (Lion, Adagrad: zero/moment_state.h) stepping several parameter groups
// over a rank's fp32 master steps views of it, one per group segment (zero/flat_groups.h), and
// keeps one state per view. Checkpoints read and write the partition's moment as one tensor, as
// they do the master's. ViewMoments holds that tensor and makes the views' states slices of it
// when it is asked for (a save, a load): a state the optimizer made at a step (by its own rule:
// Lion's zeros, Adagrad's initial_accumulator_value) is copied into its slice and replaced by it,
// and from then on the optimizer updates the slice in place (both update their moment in place).
// For a load, every view first gets a state, made by the same rule. Before any state exists the
// moment is undefined (nothing held, zeros saved), as the optimizer alone would have it.
#pragma once
#include <cstdint>
#include <vector>

#include <ATen/Tensor.h>
#include <torch/optim/optimizer.h>

namespace deepspeed {
namespace zero {

class ViewMoments {
 public:
  // `views`: the groups' views of `master` (1-D, contiguous), each a parameter of `optimizer`.
  ViewMoments(torch::optim::Optimizer& optimizer, at::Tensor master, std::vector<at::Tensor> views);

  // Moves the views' states that are not yet slices of the partition's moment into it.
  void adopt();
  // The partition's moment (1-D, master's numel); with `create`, every view's state made first.
  at::Tensor moment(bool create);
  // The views' step count (they step in lockstep): 0 before the first step. set_step: every
  // view's (step >= 0; made where missing), then adopt().
  int64_t step() const;
  void set_step(int64_t step);

 private:
  torch::optim::Optimizer& optimizer_;
  at::Tensor master_;
  std::vector<at::Tensor> views_;
  at::Tensor moment_;  // undefined until a view has state
};

}  // namespace zero
}  // namespace deepspeed
