// The per-parameter torch::optim::AdamWParamState that the optimizers of adam_moments.h keep
// (FusedAdam's layout: step, exp_avg, exp_avg_sq), read and created in one place for Lamb and the
// 1-bit family; and the AdamWOptions all of them are built with.
#pragma once
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>

#include <tuple>
#include <vector>

#include "util/torch_compat.h"

namespace deepspeed {
namespace optim {

// The group options of FusedAdam, Lamb and the 1-bit family, from a hyper-parameter struct with
// lr, beta1, beta2, eps and weight_decay (fused_adam.h, optimizer_params.h).
template <class H>
torch::optim::AdamWOptions adamw_options(const H& h) {
  return torch::optim::AdamWOptions(h.lr)
      .betas(std::make_tuple(h.beta1, h.beta2))
      .eps(h.eps)
      .weight_decay(h.weight_decay);
}

// torch::optim's step(closure) contract: the loss the closure returns, computed with autograd on
// (step() itself runs under NoGradGuard); undefined without a closure.
inline at::Tensor run_closure(const torch::optim::Optimizer::LossClosure& closure) {
  if (!closure) return {};
  at::AutoGradMode enable(true);
  return closure();
}

// Every parameter of every group, in order.
inline std::vector<at::Tensor> params_of(const torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> out;
  for (const auto& group : optimizer.param_groups())
    for (const auto& p : group.params()) out.push_back(p);
  return out;
}

// The step count of the first parameter with state (they step in lockstep); 0 before any.
inline int64_t adamw_steps(const torch::optim::Optimizer& optimizer) {
  for (const auto& p : params_of(optimizer)) {
    auto it = optimizer.state().find(compat::optimizer_state_key(p));
    if (it != optimizer.state().end())
      return static_cast<const torch::optim::AdamWParamState&>(*it->second).step();
  }
  return 0;
}

// `p`'s state, created with zero moments at step `step` when it has none.
inline torch::optim::AdamWParamState& adamw_state_or_zeros(torch::optim::Optimizer& optimizer,
                                                           const at::Tensor& p, int64_t step) {
  auto key = compat::optimizer_state_key(p);
  auto it = optimizer.state().find(key);
  if (it == optimizer.state().end()) {
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->step(step);
    s->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Contiguous));
    s->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Contiguous));
    it = optimizer.state().emplace(key, std::move(s)).first;
  }
  return static_cast<torch::optim::AdamWParamState&>(*it->second);
}

}  // namespace optim
}  // namespace deepspeed
