// A one-moment optimizer (Lion, Adagrad, SGD: zero/moment_state.h) stepping several parameter
// groups over a rank's fp32 master steps views of it, one per group segment (zero/flat_groups.h),
// and keeps one state per view. Checkpoints read and write the partition's moment as one tensor,
// as they do the master's. ViewMoments holds that tensor and makes the views' states slices of
// it, from construction: each view's state is made as the optimizer's first step would make it
// (Lion's zeros; Adagrad's initial_accumulator_value, the group's for the config's Adagrad, the
// default's for a client's), copied into its slice and pointed at it. The optimizers find the
// state and update it in place, so training is unchanged, the state is whole for a save at any
// step, and a load writes straight into it. The state is made here, at initialisation, as
// DeepSpeed's ZeRO optimizers make theirs, not at the first step: one partition-sized moment,
// never two.
// SGD is the exception: its first step makes a buffer as a copy of the gradient, and a buffer
// that exists would be scaled and added to instead (with dampening, another value), so its
// buffers are not made ahead: the tensor is made when the first buffer is (the first step holds
// both for a moment: after_step() moves the step's buffers into their slices), or when a load
// asks (moment(true)). Views of a group without momentum get no buffer; their slices stay zeros.
// (A rank whose views are all in groups without momentum has no buffer, so its SGD step reads 0
// while the others' read 1: the save takes the job's largest, runtime/engine_checkpoint.h
// agreed_optimizer_step.)
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

  // The partition's moment (1-D, master's numel); a view whose state something replaced
  // (optimizer.state().clear(), a client's own load) gets a slice again first, and with
  // `create` one without state gets state (SGD: a zero buffer; the others always have it).
  // Undefined for an SGD that keeps no buffer yet, unless `create`.
  at::Tensor moment(bool create);
  // After each optimizer step: SGD's new buffers into their slices.
  void after_step();
  // The views' step count (they step in lockstep; SGD: 1 when a view has a buffer): 0 before the
  // first step. set_step: every view's (step >= 0), after a load wrote the moment and the saved
  // options are in place.
  int64_t step() const;
  void set_step(int64_t step);

 private:
  // Makes each view's state that is not a slice of moment_ (missing when `create`, replaced, or
  // made by SGD's step) one.
  void adopt(bool create);

  torch::optim::Optimizer& optimizer_;
  bool sgd_;  // SGD: state made by its step, or a load; not ahead
  at::Tensor master_;
  std::vector<at::Tensor> views_;
  at::Tensor moment_;  // SGD: undefined until its first buffer
};

}  // namespace zero
}  // namespace deepspeed
