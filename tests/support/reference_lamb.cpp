#include "support/reference_lamb.h"

#include <algorithm>
#include <cmath>

namespace dstest {

ReferenceLamb::ReferenceLamb(std::vector<torch::Tensor> params, RefLambOptions o)
    : torch::optim::Optimizer({torch::optim::OptimizerParamGroup(params)},
                              std::make_unique<torch::optim::AdamWOptions>(o.lr)),
      o_(o) {
  for (auto& p : params) {
    m_.push_back(torch::zeros(p.sizes(), torch::kDouble));
    v_.push_back(torch::zeros(p.sizes(), torch::kDouble));
  }
}

torch::Tensor ReferenceLamb::step(LossClosure) {
  torch::NoGradGuard no_grad;
  ++t_;
  coeffs.clear();
  auto& params = param_groups()[0].params();
  for (size_t i = 0; i < params.size(); ++i) {
    auto& p = params[i];
    if (!p.grad().defined()) continue;
    torch::Tensor w = p.to(torch::kDouble);
    torch::Tensor g = p.grad().to(torch::kDouble);
    m_[i] = o_.beta1 * m_[i] + (1 - o_.beta1) * g;
    v_[i] = o_.beta2 * v_[i] + (1 - o_.beta2) * g * g;
    torch::Tensor denom = o_.eps_inside_sqrt ? torch::sqrt(v_[i] + o_.eps) : torch::sqrt(v_[i]) + o_.eps;
    torch::Tensor update = m_[i] / denom + o_.weight_decay * w;
    double w_norm = w.norm().item<double>(), u_norm = update.norm().item<double>();
    double coeff = 1.0;
    if (w_norm != 0 && u_norm != 0) coeff = std::clamp(w_norm / u_norm, o_.min_coeff, o_.max_coeff);
    coeffs.push_back(coeff);
    double step_size = o_.lr;
    if (o_.bias_correction)
      step_size = o_.lr * std::sqrt(1 - std::pow(o_.beta2, t_)) / (1 - std::pow(o_.beta1, t_));
    p.copy_(w - step_size * coeff * update);
  }
  return {};
}

}  // namespace dstest
