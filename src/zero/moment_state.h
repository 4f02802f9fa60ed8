// The per-element optimizer state that checkpoints save, load and reshard as fragments
// (checkpoint/layout.h), whichever optimizer keeps it:
//   Adam family   FusedAdam, Lamb, OneBitAdam (optim/adam_moments.h): exp_avg and exp_avg_sq
//                 in torch::optim::AdamWParamState, format "adam_fragments";
//   Lion          optim::LionParamState's exp_avg, format "lion_fragments";
//   Adagrad       torch::optim::Adagrad (the config's, a client's): its sum,
//                 format "adagrad_fragments".
// Each keeps one state per parameter tensor, every tensor stepping in lockstep, so one step
// count serves the whole partition (the manifest's "adam_step", whichever family saved it).
// Any other optimizer (SGD, a client's libtorch Adam or RMSprop, ...) is saved as libtorch's
// archive, per rank (docs/decisions.md says why SGD is not a family).
#pragma once
#include <array>
#include <cstdint>

#include <ATen/Tensor.h>
#include <torch/optim/optimizer.h>

namespace deepspeed {
namespace zero {

enum class MomentFamily { kNone, kAdam, kLion, kAdagrad };
MomentFamily moment_family(const torch::optim::Optimizer* optimizer);
// The checkpoint format a family's state is saved in (kTorchArchive for kNone).
const char* moment_format(MomentFamily family);
// Whether a save must make the state of a parameter that has none yet (before its first step,
// or its state cleared by a stage): Adagrad's starts at initial_accumulator_value, not zeros, so
// saving zeros would resume otherwise. (Adam's and Lion's start at zeros: nothing to make.)
bool saves_made_state(MomentFamily family);

// The step count of `param`'s state: -1 for kNone, 0 before its first step. And its
// counterpart for loading (no-op for step < 0; makes zeroed state where there is none).
int64_t moment_step(torch::optim::Optimizer& optimizer, const at::Tensor& param);
void set_moment_step(torch::optim::Optimizer& optimizer, const at::Tensor& param, int64_t step);

// The moments of `param`'s state as 1-D views of all its elements: [exp_avg, exp_avg_sq] (Lion:
// [exp_avg, undefined]; Adagrad: [sum, undefined]). Both undefined for kNone, or when there is
// no state yet and `create` is false; with `create`, state at step 0 is made as the optimizer's
// step would make it (zeros; Adagrad's initial_accumulator_value), for Lion and Adagrad only
// when `param` is one of the optimizer's (a stage-0 client optimizer may hold a subset).
std::array<at::Tensor, 2> moments_of(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                                     bool create);
// For a one-moment family (Lion, Adagrad): `param`'s state, which must exist, keeps `moment`
// (numel elements of param's, any shape) in place of its own tensor (zero/view_moments.h).
void set_moment(torch::optim::Optimizer& optimizer, const at::Tensor& param, const at::Tensor& moment);

}  // namespace zero
}  // namespace deepspeed
