// FusedAdam's per-tensor state as checkpoints reach it (the stages' *_checkpoint.cpp files).
#pragma once
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>

namespace deepspeed {
namespace zero {

// FusedAdam's state for `param` (keyed as torch::optim keys it), nullptr when the optimizer is
// not FusedAdam or has none yet and `create` is false; with `create`, zeroed moments at step 0
// are made.
torch::optim::AdamWParamState* adam_state_for(torch::optim::Optimizer& optimizer,
                                              const at::Tensor& param, bool create);
bool is_fused_adam(const torch::optim::Optimizer* optimizer);
// The Adam step count of `master`'s state: -1 when the optimizer is not FusedAdam, 0 before the
// first step. And its counterpart for loading (no-op for step < 0).
int64_t fused_adam_step(torch::optim::Optimizer& optimizer, const at::Tensor& master);
void set_fused_adam_step(torch::optim::Optimizer& optimizer, const at::Tensor& master, int64_t step);
// A fragment's moments: views into the state when there is one.
void attach_moments(torch::optim::AdamWParamState* state, int64_t begin, int64_t numel,
                    at::Tensor& exp_avg, at::Tensor& exp_avg_sq);

}  // namespace zero
}  // namespace deepspeed
