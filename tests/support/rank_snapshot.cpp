#include "support/rank_snapshot.h"

#include "util/torch_compat.h"

namespace dstest {

RankSnapshot snapshot(deepspeed::Engine& engine) {
  RankSnapshot s;
  s.weights = clones(engine.module().parameters());
  auto& opt = *engine.optimizer();
  for (auto& g : opt.param_groups())
    for (auto& p : g.params()) {
      s.masters.push_back(p.detach().clone());
      auto& st = static_cast<torch::optim::AdamWParamState&>(
          *opt.state().at(deepspeed::compat::optimizer_state_key(p)));
      s.moments.push_back(st.exp_avg().clone());
      s.moments.push_back(st.exp_avg_sq().clone());
    }
  return s;
}

std::vector<torch::Tensor> clones(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) out.push_back(t.detach().clone());
  return out;
}

bool all_finite(const std::vector<torch::Tensor>& tensors) {
  for (const auto& t : tensors)
    if (!t.isfinite().all().item<bool>()) return false;
  return true;
}

}  // namespace dstest
