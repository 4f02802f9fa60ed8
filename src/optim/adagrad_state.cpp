#include "optim/adagrad_state.h"

#include <torch/torch.h>

#include "util/torch_compat.h"

namespace deepspeed {
namespace optim {
namespace {

// Each parameter of `adagrad` without state: step 0 and a sum of initial_accumulator_value, that
// of its group's options (torch.optim's rule) or of the optimizer's defaults (libtorch's).
void add_missing_state(torch::optim::Adagrad& adagrad, bool from_group) {
  auto& state = adagrad.state();
  const auto& defaults = static_cast<const torch::optim::AdagradOptions&>(adagrad.defaults());
  for (auto& group : adagrad.param_groups()) {
    const auto& options = static_cast<const torch::optim::AdagradOptions&>(group.options());
    const double start = (from_group ? options : defaults).initial_accumulator_value();
    for (const auto& p : group.params()) {
      auto key = compat::optimizer_state_key(p);
      if (state.count(key)) continue;
      auto s = std::make_unique<torch::optim::AdagradParamState>();
      s->step(0);
      s->sum(torch::full_like(p, start, at::MemoryFormat::Preserve));
      state[key] = std::move(s);
    }
  }
}

}  // namespace

torch::Tensor LazyStateAdagrad::step(LossClosure closure) {
  add_missing_state(*this, /*from_group=*/true);
  return torch::optim::Adagrad::step(std::move(closure));
}

void add_missing_client_adagrad_state(torch::optim::Optimizer& optimizer) {
  auto* adagrad = dynamic_cast<torch::optim::Adagrad*>(&optimizer);
  if (!adagrad || dynamic_cast<LazyStateAdagrad*>(adagrad)) return;
  add_missing_state(*adagrad, /*from_group=*/false);
}

}  // namespace optim
}  // namespace deepspeed
