#include "optim/onebit_adam.h"

#include "optim/adamw_state.h"

#include <torch/torch.h>

#include <cmath>

#include "util/torch_compat.h"

namespace deepspeed {
namespace optim {
namespace {

// The host loops below read raw fp32 pointers in storage order: only where every tensor they
// touch is a contiguous fp32 host tensor. A gradient set by hand may be strided (a transpose's
// view); the tensor operations, which a GPU takes, are right for any layout.
bool host_loops_fit(const at::Tensor& p, const torch::optim::AdamWParamState& s) {
  auto fits = [](const at::Tensor& t) {
    return !t.defined() || (t.is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous());
  };
  return fits(p) && fits(p.grad()) && fits(s.exp_avg()) && fits(s.exp_avg_sq());
}

}  // namespace

OneBitAdam::OneBitAdam(std::vector<torch::Tensor> params, const OneBitAdamHyper& hyper,
                       comm::CommunicatorPtr comm)
    : FusedAdam(std::move(params),
                uncorrected_adamw_hyper(hyper)),
      hyper_(hyper),
      comm_(std::move(comm)) {}

int64_t OneBitAdam::steps() const { return adamw_steps(*this); }

ExtraState OneBitAdam::extra_state() const {
  ExtraState out;
  if (compressor_) compressor_->save_errors(out);
  return out;
}

// The error feedback, once the first compressed step (or a load) has made it.
int64_t OneBitAdam::extra_state_bytes() const {
  return compressor_ ? compressor_->error_bytes() : 0;
}

void OneBitAdam::load_extra_state(const ExtraState& saved) {
  if (saved.per_rank.count("worker_error")) {
    if (!compressor_) compressor_ = compressor_for(comm_, exchange_views(params_of(*this)));
    compressor_->restore_errors(saved);
  } else if (compressor_) {
    compressor_->reset_errors();
  }
  last_step_ = steps();
}

torch::Tensor OneBitAdam::step(LossClosure closure) {
  if (!frozen()) {
    torch::Tensor loss = FusedAdam::step(closure);
    last_step_ = steps();
    return loss;
  }
  torch::Tensor loss = run_closure(closure);
  compressed_step();
  return loss;
}

void OneBitAdam::compressed_step() {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> momenta;
  if (!compressor_) {
    compressor_ = compressor_for(comm_, exchange_views(params_of(*this)));
  } else if (steps() != last_step_) {
    compressor_->reset_errors();  // the Adam state was changed from outside, not by a load
  }
  // Local momentum update with this rank's own gradient (zeros where it got none: every rank
  // must compress the same tensors).
  for (auto& group : param_groups()) {
    auto& o = static_cast<torch::optim::AdamWOptions&>(group.options());
    const double beta1 = std::get<0>(o.betas());
    for (auto& p : group.params()) {
      auto it = state().find(compat::optimizer_state_key(p));
      TORCH_CHECK(it != state().end(), "OneBitAdam: a parameter has no Adam state after warm-up");
      auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
      s.step(s.step() + 1);
      momenta.push_back(s.exp_avg());
      if (!host_loops_fit(p, s)) {  // a GPU: the loop's arithmetic as tensor operations
        s.exp_avg().mul_(beta1);
        if (p.grad().defined()) s.exp_avg().add_(p.grad(), 1 - beta1);
        continue;
      }
      float* m = s.exp_avg().data_ptr<float>();
      const int64_t n = p.numel();
      const float b1 = static_cast<float>(beta1), one_minus = static_cast<float>(1 - beta1);
      if (p.grad().defined()) {
        const float* g = p.grad().data_ptr<float>();
        for (int64_t k = 0; k < n; ++k) m[k] = b1 * m[k] + one_minus * g[k];
      } else {
        for (int64_t k = 0; k < n; ++k) m[k] *= b1;
      }
    }
  }
  auto views = exchange_views(momenta);  // per parameter (self_communicating.h)
  if (comm_ && comm_->world_size() > 1) compressor_->run(views);  // COLLECTIVE
  for (size_t i = 0; i < views.size(); ++i) apply_mask(i, views[i]);
  size_t k = 0;
  for (auto& group : param_groups()) {
    auto& o = static_cast<torch::optim::AdamWOptions&>(group.options());
    for (auto& p : group.params()) {
      auto& s = static_cast<torch::optim::AdamWParamState&>(
          *state().find(compat::optimizer_state_key(p))->second);
      // p -= lr·(m / (sqrt(v) + eps) + wd·p), one pass (on a GPU a few tensor operations).
      if (!host_loops_fit(p, s)) {
        at::Tensor update = momenta[k++] / (s.exp_avg_sq().sqrt() + o.eps());
        if (o.weight_decay() != 0) update.add_(p, o.weight_decay());
        p.add_(update, -o.lr());
        continue;
      }
      const float* m = momenta[k++].data_ptr<float>();
      const float* v = s.exp_avg_sq().data_ptr<float>();
      float* w = p.data_ptr<float>();
      const float lr = static_cast<float>(o.lr()), eps = static_cast<float>(o.eps());
      const float wd = static_cast<float>(o.weight_decay());
      for (int64_t j = 0, n = p.numel(); j < n; ++j)
        w[j] -= lr * (m[j] / (std::sqrt(v[j]) + eps) + wd * w[j]);
    }
  }
  last_step_ = steps();
}

}  // namespace optim
}  // namespace deepspeed
