#include "zero/moment_state.h"

#include <type_traits>
#include <vector>

#include <torch/torch.h>

#include "checkpoint/layout.h"
#include "optim/adagrad_state.h"
#include "optim/adam_moments.h"
#include "optim/fused_adam.h"
#include "optim/lion.h"
#include "util/torch_compat.h"

namespace deepspeed {
namespace zero {
namespace {

// `param`'s state, nullptr when it has none.
template <class State>
State* find_state(torch::optim::Optimizer& optimizer, const at::Tensor& param) {
  auto it = optimizer.state().find(compat::optimizer_state_key(param));
  return it == optimizer.state().end() ? nullptr : static_cast<State*>(it->second.get());
}

// `param`'s entry in the optimizer's state, nullptr when there is none and !create; with
// create, a zeroed State at step 0 whose tensors `fill` sets.
template <class State, class Fill>
State* state_entry(torch::optim::Optimizer& optimizer, const at::Tensor& param, bool create,
                   Fill fill) {
  if (auto* s = find_state<State>(optimizer, param)) return s;
  if (!create) return nullptr;
  auto s = std::make_unique<State>();
  if constexpr (!std::is_same_v<State, torch::optim::SGDParamState>) s->step(0);
  fill(*s);
  auto* made = s.get();
  optimizer.state()[compat::optimizer_state_key(param)] = std::move(s);
  return made;
}

torch::optim::AdamWParamState* adam_state(torch::optim::Optimizer& optimizer,
                                          const at::Tensor& param, bool create) {
  return state_entry<torch::optim::AdamWParamState>(
      optimizer, param, create, [&](torch::optim::AdamWParamState& s) {
        // FusedAdam keeps a 16-bit master's moments in its own dtype (keep_moments_in).
        const auto* fused = dynamic_cast<const optim::FusedAdam*>(&optimizer);
        const auto options =
            param.options().dtype(fused ? fused->moment_dtype_for(param) : param.scalar_type());
        s.exp_avg(torch::zeros(param.sizes(), options));
        s.exp_avg_sq(torch::zeros(param.sizes(), options));
      });
}

// The parameter group holding `param`, nullptr when it is not one of the optimizer's (a stage-0
// client optimizer may hold only some of the trainable parameters: the others get no state, as
// its step would make none).
const torch::optim::OptimizerParamGroup* group_of(const torch::optim::Optimizer& optimizer,
                                                  const at::Tensor& param) {
  for (const auto& group : optimizer.param_groups())
    for (const auto& p : group.params())
      if (p.is_same(param)) return &group;
  return nullptr;
}

bool holds(const torch::optim::Optimizer& optimizer, const at::Tensor& param) {
  return group_of(optimizer, param) != nullptr;
}

optim::LionParamState* lion_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                                  bool create) {
  return state_entry<optim::LionParamState>(
      optimizer, param, create && holds(optimizer, param), [&](optim::LionParamState& s) {
        s.exp_avg(torch::zeros_like(param, torch::MemoryFormat::Contiguous));
      });
}

// Whether SGD's step keeps a buffer for `param`: one of its parameters, in a group with
// momentum (its step makes none else).
bool keeps_sgd_buffer(const torch::optim::Optimizer& optimizer, const at::Tensor& param) {
  const auto* group = group_of(optimizer, param);
  return group && static_cast<const torch::optim::SGDOptions&>(group->options()).momentum() != 0;
}

// With `create`, a buffer is made for any of the optimizer's parameters, with or without
// momentum: a load makes them before the saved options replace the engine's, which may give a
// group momentum it has not now (set_moment_step drops the ones that end up without).
torch::optim::SGDParamState* sgd_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                                       bool create) {
  return state_entry<torch::optim::SGDParamState>(
      optimizer, param, create && holds(optimizer, param),
      [&](torch::optim::SGDParamState& s) {
        s.momentum_buffer(torch::zeros_like(param, torch::MemoryFormat::Contiguous));
      });
}

// Adagrad's state is made by its own rule (optim/adagrad_state.h), not zeroed, and only for
// its own parameters.
torch::optim::AdagradParamState* adagrad_state(torch::optim::Optimizer& optimizer,
                                               const at::Tensor& param, bool create) {
  if (!create) return find_state<torch::optim::AdagradParamState>(optimizer, param);
  return optim::adagrad_state_of(static_cast<torch::optim::Adagrad&>(optimizer), param);
}

}  // namespace

MomentFamily moment_family(const torch::optim::Optimizer* optimizer) {
  if (dynamic_cast<const optim::AdamMoments*>(optimizer)) return MomentFamily::kAdam;
  if (dynamic_cast<const optim::Lion*>(optimizer)) return MomentFamily::kLion;
  if (dynamic_cast<const torch::optim::Adagrad*>(optimizer)) return MomentFamily::kAdagrad;
  if (dynamic_cast<const torch::optim::SGD*>(optimizer)) return MomentFamily::kSgd;
  return MomentFamily::kNone;
}

bool saves_made_state(MomentFamily family) { return family == MomentFamily::kAdagrad; }

bool keeps_one_moment(MomentFamily family) {
  return family == MomentFamily::kLion || family == MomentFamily::kAdagrad ||
         family == MomentFamily::kSgd;
}

const char* moment_format(MomentFamily family) {
  switch (family) {
    case MomentFamily::kAdam: return checkpoint::kAdamFragments;
    case MomentFamily::kLion: return checkpoint::kLionFragments;
    case MomentFamily::kAdagrad: return checkpoint::kAdagradFragments;
    case MomentFamily::kSgd: return checkpoint::kSgdFragments;
    case MomentFamily::kNone: break;
  }
  return checkpoint::kTorchArchive;
}

int64_t moment_step(torch::optim::Optimizer& optimizer, const at::Tensor& param) {
  switch (moment_family(&optimizer)) {
    case MomentFamily::kAdam: {
      auto* s = adam_state(optimizer, param, /*create=*/false);
      return s ? s->step() : 0;
    }
    case MomentFamily::kLion: {
      auto* s = lion_state(optimizer, param, /*create=*/false);
      return s ? s->step() : 0;
    }
    case MomentFamily::kAdagrad: {
      auto* s = adagrad_state(optimizer, param, /*create=*/false);
      return s ? s->step() : 0;
    }
    case MomentFamily::kSgd: return sgd_state(optimizer, param, /*create=*/false) ? 1 : 0;
    case MomentFamily::kNone: break;
  }
  return -1;
}

void set_moment_step(torch::optim::Optimizer& optimizer, const at::Tensor& param, int64_t step) {
  if (step < 0) return;
  switch (moment_family(&optimizer)) {
    case MomentFamily::kAdam: adam_state(optimizer, param, /*create=*/true)->step(step); break;
    case MomentFamily::kLion: lion_state(optimizer, param, /*create=*/true)->step(step); break;
    case MomentFamily::kAdagrad: adagrad_state(optimizer, param, /*create=*/true)->step(step); break;
    case MomentFamily::kSgd:
      if (step > 0 && keeps_sgd_buffer(optimizer, param))
        sgd_state(optimizer, param, /*create=*/true);
      else  // before the first step, or a group without momentum: no buffer, as a fresh SGD
        optimizer.state().erase(compat::optimizer_state_key(param));
      break;
    case MomentFamily::kNone: break;
  }
}

std::array<at::Tensor, 2> moments_of(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                                     bool create) {
  switch (moment_family(&optimizer)) {
    case MomentFamily::kAdam:
      if (auto* s = adam_state(optimizer, param, create))
        return {s->exp_avg().view({-1}), s->exp_avg_sq().view({-1})};
      break;
    case MomentFamily::kLion:
      if (auto* s = lion_state(optimizer, param, create)) return {s->exp_avg().view({-1}), {}};
      break;
    case MomentFamily::kAdagrad:
      if (auto* s = adagrad_state(optimizer, param, create)) return {s->sum().view({-1}), {}};
      break;
    case MomentFamily::kSgd:
      if (auto* s = sgd_state(optimizer, param, create))
        return {s->momentum_buffer().view({-1}), {}};
      break;
    case MomentFamily::kNone: break;
  }
  return {};
}

StateMadeSince::StateMadeSince(const torch::optim::Optimizer& optimizer) {
  for (const auto& entry : optimizer.state()) before_.insert(entry.first);
}

void StateMadeSince::drop(torch::optim::Optimizer& optimizer) const {
  std::vector<compat::OptimizerStateKey> made;
  for (const auto& entry : optimizer.state())
    if (!before_.count(entry.first)) made.push_back(entry.first);
  for (const auto& key : made) optimizer.state().erase(key);
}

void set_moment(torch::optim::Optimizer& optimizer, const at::Tensor& param, const at::Tensor& moment) {
  const auto family = moment_family(&optimizer);
  TORCH_CHECK(keeps_one_moment(family), "set_moment: not a one-moment optimizer (internal error)");
  const at::Tensor shaped = moment.view(param.sizes());
  if (family == MomentFamily::kLion)
    lion_state(optimizer, param, /*create=*/false)->exp_avg(shaped);
  else if (family == MomentFamily::kAdagrad)
    adagrad_state(optimizer, param, /*create=*/false)->sum(shaped);
  else
    sgd_state(optimizer, param, /*create=*/false)->momentum_buffer(shaped);
}

}  // namespace zero
}  // namespace deepspeed
