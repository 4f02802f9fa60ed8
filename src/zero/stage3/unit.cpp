// ZeroUnitBase's non-template half: adopting the inner module, the identity function whose
// backward re-gathers a unit, and the weight-saving linear.
#include <torch/torch.h>

#include "deepspeed/zero_init.h"
#include "deepspeed/zero_unit.h"

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

at::Tensor ZeroUnitBase::attach_output(const at::Tensor& out) const {
  if (!out.defined() || !out.requires_grad() || !torch::GradMode::is_enabled()) return out;
  return PreBackwardGather::apply(out, reinterpret_cast<int64_t>(hooks_), id_);
}

}  // namespace deepspeed
