#include "optim/onebit_lamb.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>

#include "optim/adamw_state.h"

namespace deepspeed {
namespace optim {
namespace {

// The warm-up is Lamb as OnebitLamb computes it: no bias correction, eps outside the sqrt.
LambHyper warmup_lamb(const OneBitLambHyper& h) {
  LambHyper l;
  l.lr = h.lr;
  l.beta1 = h.beta1;
  l.beta2 = h.beta2;
  l.eps = h.eps;
  l.weight_decay = h.weight_decay;
  l.bias_correction = false;
  l.eps_inside_sqrt = false;
  l.max_coeff = h.max_coeff;
  l.min_coeff = h.min_coeff;
  return l;
}

double l2(const at::Tensor& t) { return t.to(torch::kDouble).norm().item<double>(); }

// Lamb's trust ratio (lamb.cpp's clamp_ratio, FusedLamb's): 1 when either norm is zero.
double trust_ratio(const OneBitLambHyper& h, double w_norm, double u_norm) {
  if (w_norm == 0 || u_norm == 0) return 1.0;
  return std::clamp(w_norm / u_norm, h.min_coeff, h.max_coeff);
}

}  // namespace

OneBitLamb::OneBitLamb(std::vector<torch::Tensor> params, const OneBitLambHyper& hyper,
                       comm::CommunicatorPtr comm)
    : Lamb(std::move(params), warmup_lamb(hyper)),
      hyper_(hyper),
      comm_(std::move(comm)) {
  size_per_unit();
}

int64_t OneBitLamb::steps() const { return adamw_steps(*this); }

std::vector<at::Tensor> OneBitLamb::units() const { return exchange_views(params_of(*this)); }

// Before this object's first step the values are the starting ones (0 and 1), so resizing loses
// nothing, even at a step count > 0 (a load that set the moments but skipped the extra state);
// a size change after that would mean the segments changed under a running optimizer.
void OneBitLamb::size_per_unit() {
  const size_t n = units().size();
  if (coeff_freeze_.size() == n) return;
  TORCH_CHECK(!stepped_, "OneBitLamb: the segments changed after ", steps(),
              " steps (ratio averages for ", coeff_freeze_.size(), " parameters, now ", n, ")");
  coeff_freeze_.assign(n, 0.0);
  last_factor_.assign(n, 1.0);
}

// After the warm-up every rank must compress the same tensors, used by its graph or not.
torch::optim::AdamWParamState& OneBitLamb::state_or_zeros(const at::Tensor& p) {
  return adamw_state_or_zeros(*this, p, steps());
}

torch::Tensor OneBitLamb::step(LossClosure closure) {
  size_per_unit();
  stepped_ = true;
  if (!frozen()) {
    torch::Tensor loss = Lamb::step(closure);
    after_warmup_step();
    return loss;
  }
  torch::Tensor loss = run_closure(closure);
  if (!coeff_freeze_known_) rebuild_coeff_freeze();
  compressed_step();
  return loss;
}

// The ratios of this warm-up step feed the running average; the last warm-up step starts the
// fresh variance. Over separate tensors Lamb skipped those without a gradient, so lamb_coeffs()
// holds one per tensor that had one, in order; over segments (Lamb's fragmented step) it holds
// one per segment, every one of them.
void OneBitLamb::after_warmup_step() {
  const auto ps = params_of(*this);
  const bool segmented = !segment_params().empty();
  size_t k = 0;
  for (size_t i = 0; i < coeff_freeze_.size(); ++i) {
    if (!segmented && !ps[i].grad().defined()) continue;
    const double ratio = coeffs_.at(k++);
    if (ratio != 1.0)
      coeff_freeze_[i] = hyper_.coeff_beta * coeff_freeze_[i] + (1 - hyper_.coeff_beta) * ratio;
  }
  if (!frozen()) return;
  coeff_freeze_known_ = true;
  fresh_.clear();
  for (const auto& p : ps) fresh_.push_back(state_or_zeros(p).exp_avg_sq().clone());
}

// Frozen, and the warm-up's ratio average is neither this optimizer's own nor loaded: left at 0,
// every frozen step would be p -= lr·0·factor·u, a silent stall. The nearest stand-in the loaded
// state offers is the ratio a Lamb step would apply now, per unit, computed once; from here on it
// is kept and saved as if the warm-up had produced it. Identical on every rank (the moments and
// weights are), so no collective.
void OneBitLamb::rebuild_coeff_freeze() {
  torch::NoGradGuard no_grad;
  const auto ps = params_of(*this);
  const auto& o = static_cast<const torch::optim::AdamWOptions&>(param_groups()[0].options());
  std::vector<at::Tensor> whole_m, whole_v;
  for (const auto& p : ps) {
    auto& s = state_or_zeros(p);
    whole_m.push_back(s.exp_avg());
    whole_v.push_back(s.exp_avg_sq());
  }
  const auto params = units(), momenta = exchange_views(whole_m),
             variances = exchange_views(whole_v);
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor update = momenta[i] / (variances[i].sqrt() + o.eps());
    if (o.weight_decay() > 0) update = update + params[i] * o.weight_decay();
    coeff_freeze_[i] = trust_ratio(hyper_, l2(params[i]), l2(update));
  }
  coeff_freeze_known_ = true;
  if (!comm_ || comm_->rank() == 0)
    std::cerr << "[deepspeed] warning: OneBitLamb at step " << steps()
              << " is past its warm-up (freeze_step " << hyper_.freeze_step
              << ") but the load restored no coeff_freeze (its extra optimizer state was skipped "
                 "or saved by another optimizer): rebuilt each frozen trust ratio from the "
                 "loaded weights and moments as Lamb's clamp(|p| / |m/(sqrt(v)+eps) + "
                 "weight_decay*p|); training continues, not bit for bit as an unbroken run\n";
}

// Per unit i (a parameter, or a segment of the master): m_before, m, v and fresh are the
// matching views, so the arithmetic below is the same in fp32 and in 16 bits.
void OneBitLamb::compressed_step() {
  torch::NoGradGuard no_grad;
  const auto ps = params_of(*this);
  if (fresh_.empty())  // frozen from a checkpoint without the fresh variance: start from v
    for (const auto& p : ps) fresh_.push_back(state_or_zeros(p).exp_avg_sq().clone());
  const auto& o = static_cast<const torch::optim::AdamWOptions&>(param_groups()[0].options());
  const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
  std::vector<at::Tensor> whole_m, whole_before, whole_v;
  for (const auto& p : ps) {
    auto& s = state_or_zeros(p);
    s.step(s.step() + 1);
    whole_before.push_back(s.exp_avg().clone());
    s.exp_avg().mul_(beta1);
    if (p.grad().defined()) s.exp_avg().add_(p.grad(), 1 - beta1);
    whole_m.push_back(s.exp_avg());
    whole_v.push_back(s.exp_avg_sq());
  }
  const auto params = units(), momenta = exchange_views(whole_m),
             before = exchange_views(whole_before), variances = exchange_views(whole_v),
             fresh = exchange_views(fresh_);
  if (!compressor_) compressor_ = compressor_for(comm_, momenta);
  if (comm_ && comm_->world_size() > 1) compressor_->run(momenta);  // COLLECTIVE
  for (size_t i = 0; i < momenta.size(); ++i) {
    at::Tensor m = momenta[i];
    apply_mask(i, m);
  }
  coeffs_.assign(params.size(), 1.0);
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor p = params[i];
    at::Tensor implied = (momenta[i] - before[i] * beta1) / (1 - beta1);
    fresh[i].mul_(beta2).addcmul_(implied, implied, 1 - beta2);
    at::Tensor denom = variances[i].sqrt().add_(o.eps());
    at::Tensor prelim = momenta[i] / denom;
    at::Tensor update = o.weight_decay() > 0 ? prelim + p * o.weight_decay() : prelim;
    double factor = (denom / (fresh[i].sqrt() + o.eps())).max().item<double>();
    if (o.weight_decay() > 0) {
      const double u_norm = l2(update);
      const double r = u_norm > 0 ? std::min(1.0, l2(prelim) / u_norm) : 1.0;
      factor = factor * r + (1.0 - r);
    }
    factor = std::clamp(factor, hyper_.factor_min, hyper_.factor_max);
    factor = std::clamp(factor, last_factor_[i] * (1.0 - hyper_.factor_threshold),
                        last_factor_[i] * (1.0 + hyper_.factor_threshold));
    last_factor_[i] = factor;
    coeffs_[i] = coeff_freeze_[i] * factor;
    p.add_(update, -o.lr() * coeffs_[i]);
  }
}

ExtraState OneBitLamb::extra_state() const {
  ExtraState out;
  out.replicated["coeff_freeze"] = torch::tensor(coeff_freeze_, torch::kDouble);
  out.replicated["last_factor"] = torch::tensor(last_factor_, torch::kDouble);
  // Per unit, so the layout is the parameters' in fp32 and in 16 bits alike (the master's
  // alignment padding is left out): either precision loads the other's.
  if (!fresh_.empty()) out.replicated["exp_avg_sq_fresh"] = concat_flat(exchange_views(fresh_));
  if (compressor_) compressor_->save_errors(out);
  return out;
}

// The error feedback, the fresh variance (one fp32 per element of each optimizer tensor: in 16
// bits the whole master, its padding too) and the two per-unit scalars.
int64_t OneBitLamb::extra_state_bytes() const {
  return (compressor_ ? compressor_->error_bytes() : 0) + storage_bytes_of(fresh_) +
         static_cast<int64_t>(sizeof(double) * (coeff_freeze_.size() + last_factor_.size()));
}

void OneBitLamb::load_extra_state(const ExtraState& saved) {
  const auto ps = params_of(*this);
  const size_t n = units().size();
  auto scalars = [&](const char* name, std::vector<double>& dst, double fallback) {
    auto it = saved.replicated.find(name);
    if (it == saved.replicated.end()) {
      dst.assign(n, fallback);
      return;
    }
    TORCH_CHECK(it->second.numel() == static_cast<int64_t>(n), "saved ", name, " has ",
                it->second.numel(), " values, this optimizer has ", n,
                " parameters (segments in 16 bits)");
    at::Tensor t = it->second.to(torch::kCPU, torch::kDouble).contiguous();  // read on the host
    dst.assign(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  };
  scalars("coeff_freeze", coeff_freeze_, 0.0);
  // Without it a frozen optimizer rebuilds the ratios at its next step (rebuild_coeff_freeze).
  coeff_freeze_known_ = saved.replicated.count("coeff_freeze") > 0;
  scalars("last_factor", last_factor_, 1.0);
  fresh_.clear();
  auto fresh = saved.replicated.find("exp_avg_sq_fresh");
  if (fresh != saved.replicated.end()) {
    for (const auto& p : ps) fresh_.push_back(torch::zeros_like(p));
    copy_from_flat(fresh->second, exchange_views(fresh_), "exp_avg_sq_fresh");
  }
  if (saved.per_rank.count("worker_error")) {
    if (!compressor_) compressor_ = compressor_for(comm_, units());
    compressor_->restore_errors(saved);
  } else if (compressor_) {
    compressor_->reset_errors();
  }
}

}  // namespace optim
}  // namespace deepspeed
