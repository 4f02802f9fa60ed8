#include "optim/adagrad_state.h"

#include <torch/torch.h>

#include "util/torch_compat.h"

namespace deepspeed {
namespace optim {
namespace {

// `p` (of `group`) gets step 0 and a sum of initial_accumulator_value, that of its group's
// options (torch.optim's rule) or of the optimizer's defaults (libtorch's), unless it has state.
void add_state_if_missing(torch::optim::Adagrad& adagrad, torch::optim::OptimizerParamGroup& group,
                          const at::Tensor& p, bool from_group) {
  auto& state = adagrad.state();
  auto key = compat::optimizer_state_key(p);
  if (state.count(key)) return;
  const auto& defaults = static_cast<const torch::optim::AdagradOptions&>(adagrad.defaults());
  const auto& options = static_cast<const torch::optim::AdagradOptions&>(group.options());
  const double start = (from_group ? options : defaults).initial_accumulator_value();
  auto s = std::make_unique<torch::optim::AdagradParamState>();
  s->step(0);
  s->sum(torch::full_like(p, start, at::MemoryFormat::Preserve));
  state[key] = std::move(s);
}

void add_missing_state(torch::optim::Adagrad& adagrad, bool from_group) {
  for (auto& group : adagrad.param_groups())
    for (const auto& p : group.params()) add_state_if_missing(adagrad, group, p, from_group);
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

torch::optim::AdagradParamState* adagrad_state_of(torch::optim::Adagrad& adagrad,
                                                  const at::Tensor& param) {
  const bool from_group = dynamic_cast<LazyStateAdagrad*>(&adagrad) != nullptr;
  for (auto& group : adagrad.param_groups())
    for (const auto& p : group.params())
      if (p.is_same(param)) {
        add_state_if_missing(adagrad, group, p, from_group);
        return static_cast<torch::optim::AdagradParamState*>(
            adagrad.state().at(compat::optimizer_state_key(p)).get());
      }
  return nullptr;
}

}  // namespace optim
}  // namespace deepspeed
