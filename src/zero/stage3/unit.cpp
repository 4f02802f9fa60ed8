// ZeroUnitBase's non-template half: adopting the inner module, the identity function whose
// backward re-gathers a unit, and the weight-saving linear.
#include <torch/torch.h>

#include <unordered_set>

#include <c10/util/accumulate.h>

#include "deepspeed/zero_init.h"
#include "deepspeed/zero_unit.h"
#include "zero/stage3/full_parameter_sizes.h"
#include "zero/stage3/unit_internals.h"

namespace deepspeed {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Forward: identity. Backward: the unit's gradients are about to be computed, so gather it.
struct PreBackwardGather : torch::autograd::Function<PreBackwardGather> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t hooks, int64_t unit) {
    ctx->saved_data["hooks"] = hooks;
    ctx->saved_data["unit"] = unit;
    return x;  // returned as a view, to which autograd attaches this node
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* hooks = reinterpret_cast<zero::UnitHooks*>(ctx->saved_data["hooks"].toInt());
    hooks->pre_backward(static_cast<int>(ctx->saved_data["unit"].toInt()));
    return {grads[0], at::Tensor(), at::Tensor()};
  }
};

// Saves the weight leaf itself: autograd restores a saved leaf by reference, so the weight's data
// may be released after forward and gathered again before this backward runs. (Autograd functions
// take no undefined tensors, hence the bias-less twin.)
variable_list linear_backward(AutogradContext* ctx, const at::Tensor& g, bool bias) {
  auto saved = ctx->get_saved_variables();
  const at::Tensor &x = saved[0], &w = saved[1];
  at::Tensor g2 = g.reshape({-1, g.size(-1)});
  variable_list grads{g.matmul(w), g2.t().mm(x.reshape({-1, x.size(-1)}))};
  if (bias) grads.push_back(g2.sum(0));
  return grads;
}

struct ZeroLinear : torch::autograd::Function<ZeroLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const at::Tensor& b) {
    ctx->save_for_backward({x, w});
    return at::linear(x, w, b);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return linear_backward(ctx, grads[0], /*bias=*/true);
  }
};

struct ZeroLinearNoBias : torch::autograd::Function<ZeroLinearNoBias> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w) {
    ctx->save_for_backward({x, w});
    return at::linear(x, w);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return linear_backward(ctx, grads[0], /*bias=*/false);
  }
};
}  // namespace

namespace zero {
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return bias.defined() ? ZeroLinear::apply(x, weight, bias) : ZeroLinearNoBias::apply(x, weight);
}
}  // namespace zero

void ZeroUnitBase::adopt(std::shared_ptr<torch::nn::Module> inner) {
  inner_ = std::move(inner);
  for (auto& kv : inner_->named_parameters(/*recurse=*/false))
    register_parameter(kv.key(), kv.value(), kv.value().requires_grad());
  for (auto& kv : inner_->named_buffers(/*recurse=*/false)) register_buffer(kv.key(), kv.value());
  for (auto& kv : inner_->named_children()) register_module(kv.key(), kv.value());
  if (auto* init = zero::Init::current()) init->partition(*this);
}

void ZeroUnitBase::train(bool on) {
  torch::nn::Module::train(on);
  if (inner_) inner_->train(on);
}

void ZeroUnitBase::pre_forward() const { hooks_->pre_forward(id_); }
void ZeroUnitBase::post_forward() const { hooks_->post_forward(id_); }

at::Tensor ZeroUnitBase::attach_output(const at::Tensor& out) const {
  if (!out.defined() || !out.requires_grad() || !torch::GradMode::is_enabled()) return out;
  if (!hooks_->needs_pre_backward()) return out;
  return PreBackwardGather::apply(out, reinterpret_cast<int64_t>(hooks_), id_);
}

namespace zero {

std::unordered_map<const c10::TensorImpl*, int64_t> partitioned_parameter_numels(
    const torch::nn::Module& root) {
  std::unordered_map<const c10::TensorImpl*, int64_t> out;
  auto visit = [&](const torch::nn::Module& m) {
    const auto* unit = dynamic_cast<const ZeroUnitBase*>(&m);
    if (!unit) return;
    auto add = [&](const std::vector<at::Tensor>& params,
                   const std::vector<std::vector<int64_t>>& shapes) {
      for (size_t i = 0; i < params.size(); ++i)
        out.emplace(params[i].unsafeGetTensorImpl(), c10::multiply_integers(shapes[i]));
    };
    if (auto* hooks = detail::ZeroUnitAccess::hooks(*unit)) {
      const auto& slots = hooks->unit_slots(detail::ZeroUnitAccess::id(*unit));
      add(slots.params, slots.shapes);
    } else if (const auto* shard = init_shard(*unit)) {
      add(shard->params, shard->shapes);
    }
  };
  visit(root);
  for (const auto& m : root.modules(/*include_self=*/false)) visit(*m);
  return out;
}

}  // namespace zero

// A unit's partitioned parameters at the shapes their owner recorded; whatever is left is whole.
int64_t count_parameters(const torch::nn::Module& module) {
  const auto partitioned = zero::partitioned_parameter_numels(module);
  int64_t total = 0;
  for (const auto& [impl, numel] : partitioned) total += numel;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& p : module.parameters())
    if (!partitioned.count(p.unsafeGetTensorImpl()) && seen.insert(p.unsafeGetTensorImpl()).second)
      total += p.numel();
  return total;
}

}  // namespace deepspeed
