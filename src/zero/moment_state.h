// The per-element optimizer state that checkpoints save, load and reshard as fragments
// (checkpoint/layout.h), whichever optimizer keeps it:
//   Adam family   FusedAdam, Lamb, OneBitAdam (optim/adam_moments.h): exp_avg and exp_avg_sq
//                 in torch::optim::AdamWParamState, format "adam_fragments";
//   Lion          optim::LionParamState's exp_avg, format "lion_fragments";
//   Adagrad       torch::optim::Adagrad (the config's, a client's): its sum,
//                 format "adagrad_fragments";
//   SGD           torch::optim::SGD (the config's, a client's) with momentum: its
//                 momentum_buffer, format "sgd_fragments".
// Each keeps one state per parameter tensor, every tensor stepping in lockstep, so one step
// count serves the whole partition (the manifest's "adam_step", whichever family saved it).
// SGD counts no steps: its "step" is 1 once its buffers exist, 0 before (its first step makes
// each buffer a copy of the gradient, where a later one scales it by the momentum and adds
// (1 - dampening)·gradient, so whether a buffer exists is state a resume must keep).
// Any other optimizer (a client's libtorch Adam, AdamW or RMSprop, ...) is saved as libtorch's
// archive, per rank.
#pragma once
#include <array>
#include <cstdint>
#include <set>

#include <ATen/Tensor.h>
#include <torch/optim/optimizer.h>

#include "util/torch_compat.h"

namespace deepspeed {
namespace zero {

enum class MomentFamily { kNone, kAdam, kLion, kAdagrad, kSgd };
MomentFamily moment_family(const torch::optim::Optimizer* optimizer);
// The checkpoint format a family's state is saved in (kTorchArchive for kNone).
const char* moment_format(MomentFamily family);
// Whether a save must make the state of a parameter that has none yet (before its first step,
// or its state cleared by a stage): Adagrad's starts at initial_accumulator_value, not zeros, so
// saving zeros would resume otherwise. (Adam's and Lion's start at zeros: nothing to make.)
bool saves_made_state(MomentFamily family);
// Lion, Adagrad, SGD: one per-element state tensor (zero/view_moments.h, set_moment).
bool keeps_one_moment(MomentFamily family);

// The step count of `param`'s state: -1 for kNone, 0 before its first step (SGD: 1 when its
// buffer exists, else 0). And its counterpart for loading, after the saved group options are in
// place: no-op for step < 0; makes zeroed state where there is none. SGD: step 0, or a group
// without momentum, removes the buffer (the next step then makes it from the gradient, as a
// first step does); step >= 1 keeps or makes it.
int64_t moment_step(torch::optim::Optimizer& optimizer, const at::Tensor& param);
void set_moment_step(torch::optim::Optimizer& optimizer, const at::Tensor& param, int64_t step);

// The moments of `param`'s state as 1-D views of all its elements: [exp_avg, exp_avg_sq] (Lion:
// [exp_avg, undefined]; Adagrad: [sum, undefined]; SGD: [momentum_buffer, undefined]). Both
// undefined for kNone, or when there is no state yet and `create` is false; with `create`, state
// at step 0 is made as the optimizer's step would make it (zeros; Adagrad's
// initial_accumulator_value), for Lion, Adagrad and SGD only when `param` is one of the
// optimizer's (a stage-0 client optimizer may hold a subset); SGD's in any group, with momentum
// or not (a load reads the buffers before the saved options say which groups keep them).
std::array<at::Tensor, 2> moments_of(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                                     bool create);
// The optimizer's state entries before a load's planning makes state to load into
// (state_to_load with create). A load that fails afterwards drops the entries made since, so the
// optimizer is as it was: a fresh SGD keeps having no buffer (a zero one would change its first
// step from g to (1 - dampening)·g). Entries replaced since stay (none is, by a failed load).
class StateMadeSince {
 public:
  explicit StateMadeSince(const torch::optim::Optimizer& optimizer);
  void drop(torch::optim::Optimizer& optimizer) const;

 private:
  std::set<compat::OptimizerStateKey> before_;
};

// For a one-moment family (Lion, Adagrad, SGD): `param`'s state, which must exist, keeps `moment`
// (numel elements of param's, any shape) in place of its own tensor (zero/view_moments.h).
void set_moment(torch::optim::Optimizer& optimizer, const at::Tensor& param, const at::Tensor& moment);

}  // namespace zero
}  // namespace deepspeed
