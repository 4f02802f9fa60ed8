#include "optim/lamb.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "optim/adamw_state.h"

namespace deepspeed {
namespace optim {
Lamb::Lamb(std::vector<torch::Tensor> params, const LambHyper& hyper)
    : torch::optim::Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                              std::make_unique<torch::optim::AdamWOptions>(adamw_options(hyper))),
      hyper_(hyper) {}

void Lamb::set_fragments(std::vector<Fragment> fragments, int64_t num_params, NormSum sum) {
  TORCH_CHECK(param_groups().size() == 1 && param_groups()[0].params().size() == 1,
              "Lamb::set_fragments: the optimizer must hold exactly one tensor (a partition)");
  const int64_t n = param_groups()[0].params()[0].numel();
  for (const auto& f : fragments)
    TORCH_CHECK(f.param >= 0 && f.param < num_params && f.begin >= 0 && f.begin + f.numel <= n,
                "Lamb::set_fragments: fragment of parameter ", f.param, " [", f.begin, ", +",
                f.numel, ") is outside the tensor of ", n, " elements");
  fragments_ = std::move(fragments);
  num_params_ = num_params;
  sum_ = std::move(sum);
}

torch::optim::AdamWParamState& Lamb::state_of(const torch::Tensor& p) {
  return adamw_state_or_zeros(*this, p, 0);
}

torch::Tensor Lamb::moments_and_update(const torch::Tensor& p, const torch::Tensor& grad,
                                       torch::optim::AdamWParamState& s,
                                       const torch::optim::AdamWOptions& o) {
  const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
  torch::Tensor g = grad_scale_ == 1.0f ? grad : grad * grad_scale_;
  s.exp_avg().mul_(beta1).add_(g, 1 - beta1);
  s.exp_avg_sq().mul_(beta2).addcmul_(g, g, 1 - beta2);
  torch::Tensor denom = hyper_.eps_inside_sqrt ? (s.exp_avg_sq() + o.eps()).sqrt_()
                                               : s.exp_avg_sq().sqrt().add_(o.eps());
  torch::Tensor u = s.exp_avg() / denom;
  if (o.weight_decay() != 0) u.add_(p, o.weight_decay());
  return u;
}

double Lamb::step_size(const torch::optim::AdamWOptions& o, int64_t step) const {
  if (!hyper_.bias_correction) return o.lr();
  const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
  return o.lr() * std::sqrt(1 - std::pow(beta2, step)) / (1 - std::pow(beta1, step));
}

// FusedLamb's clamp: the ratio is 1 when either norm is zero (a fresh zero-initialised bias, or
// no update), else ‖p‖/‖u‖ clamped to [min_coeff, max_coeff].
double Lamb::clamp_ratio(double w_norm, double u_norm) const {
  if (w_norm == 0 || u_norm == 0) return 1.0;
  return std::min(hyper_.max_coeff, std::max(hyper_.min_coeff, w_norm / u_norm));
}

// One tensor holding fragments of many parameters (a ZeRO partition).
void Lamb::fragmented_step(torch::Tensor& p, const torch::optim::AdamWOptions& o) {
  auto& s = state_of(p);
  s.step(s.step() + 1);
  torch::Tensor u = moments_and_update(p, p.grad(), s, o);
  // squares[0][i] = Σ p², squares[1][i] = Σ u² over this rank's fragments of parameter i,
  // summed on p's device: on a GPU one host read per step (below), not two per fragment.
  torch::Tensor squares = torch::zeros({2, num_params_}, p.options().dtype(torch::kDouble));
  for (const auto& f : fragments_) {
    squares.select(0, 0).narrow(0, f.param, 1).add_(
        p.narrow(0, f.begin, f.numel).to(torch::kDouble).pow(2).sum());
    squares.select(0, 1).narrow(0, f.param, 1).add_(
        u.narrow(0, f.begin, f.numel).to(torch::kDouble).pow(2).sum());
  }
  if (sum_) sum_(squares);  // COLLECTIVE: whole-parameter sums on every rank
  squares = squares.cpu();
  auto sq = squares.accessor<double, 2>();
  coeffs_.assign(num_params_, 1.0);
  for (int64_t i = 0; i < num_params_; ++i)
    coeffs_[i] = clamp_ratio(std::sqrt(sq[0][i]), std::sqrt(sq[1][i]));
  const double size = step_size(o, s.step());
  for (const auto& f : fragments_)
    p.narrow(0, f.begin, f.numel).add_(u.narrow(0, f.begin, f.numel), -size * coeffs_[f.param]);
}

torch::Tensor Lamb::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss = run_closure(closure);
  if (num_params_ > 0) {
    auto& group = param_groups()[0];
    auto& p = group.params()[0];
    // Every rank of the group must reach the norm all-reduce, gradient or not.
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    fragmented_step(p, static_cast<torch::optim::AdamWOptions&>(group.options()));
    grad_scale_ = 1.0f;
    return loss;
  }
  coeffs_.clear();
  for (auto& group : param_groups()) {
    auto& o = static_cast<torch::optim::AdamWOptions&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& s = state_of(p);
      s.step(s.step() + 1);
      torch::Tensor u = moments_and_update(p, p.grad(), s, o);
      const double ratio = clamp_ratio(p.to(torch::kDouble).norm().item<double>(),
                                       u.to(torch::kDouble).norm().item<double>());
      coeffs_.push_back(ratio);
      p.add_(u, -step_size(o, s.step()) * ratio);
    }
  }
  grad_scale_ = 1.0f;
  return loss;
}

}  // namespace optim
}  // namespace deepspeed
