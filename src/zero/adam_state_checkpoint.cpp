#include "zero/adam_state_checkpoint.h"

#include <torch/torch.h>

#include "optim/adam_moments.h"
#include "util/torch_compat.h"

namespace deepspeed {
namespace zero {

// FusedAdam, Lamb and OneBitAdam keep the same per-parameter state (optim/adam_moments.h).
bool is_fused_adam(const torch::optim::Optimizer* optimizer) {
  return dynamic_cast<const optim::AdamMoments*>(optimizer) != nullptr;
}

torch::optim::AdamWParamState* adam_state_for(torch::optim::Optimizer& optimizer,
                                              const at::Tensor& param, bool create) {
  if (!is_fused_adam(&optimizer)) return nullptr;
  auto key = compat::optimizer_state_key(param);
  auto it = optimizer.state().find(key);
  if (it == optimizer.state().end()) {
    if (!create) return nullptr;
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->step(0);
    s->exp_avg(torch::zeros_like(param, torch::MemoryFormat::Contiguous));
    s->exp_avg_sq(torch::zeros_like(param, torch::MemoryFormat::Contiguous));
    it = optimizer.state().emplace(key, std::move(s)).first;
  }
  return static_cast<torch::optim::AdamWParamState*>(it->second.get());
}

void attach_moments(torch::optim::AdamWParamState* state, int64_t begin, int64_t numel,
                    at::Tensor& exp_avg, at::Tensor& exp_avg_sq) {
  if (!state) return;
  exp_avg = state->exp_avg().view({-1}).narrow(0, begin, numel);
  exp_avg_sq = state->exp_avg_sq().view({-1}).narrow(0, begin, numel);
}

int64_t fused_adam_step(torch::optim::Optimizer& optimizer, const at::Tensor& master) {
  if (!is_fused_adam(&optimizer)) return -1;
  auto* state = adam_state_for(optimizer, master, /*create=*/false);
  return state ? state->step() : 0;
}

void set_fused_adam_step(torch::optim::Optimizer& optimizer, const at::Tensor& master, int64_t step) {
  if (step < 0) return;
  if (auto* state = adam_state_for(optimizer, master, /*create=*/true)) state->step(step);
}

}  // namespace zero
}  // namespace deepspeed
