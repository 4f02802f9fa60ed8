#include "optim/zero_one_adam.h"

#include "optim/adamw_state.h"

#include <torch/torch.h>

#include <algorithm>

#include "deepspeed/errors.h"
#include "util/torch_compat.h"

namespace deepspeed {
namespace optim {
namespace {

// Phase 1's bookkeeping after step `step`: var_interval doubles after every var_update_scaler
// variance steps (steps that are multiples of the interval).
void advance_var_interval(int64_t step, int64_t scaler, int64_t& interval, int64_t& counter) {
  if (step % interval == 0 && ++counter == scaler) {
    counter = 0;
    interval *= 2;
  }
}

// The layout of the per-rank phase-2 state (per_rank "layout"): 2 = per parameter, or per segment
// of the 16-bit master, in the model's order and without the master's alignment padding, so fp32
// and 16 bits save the same thing and either loads the other's. Checkpoints before it (no marker)
// saved the optimizer's own tensors: in 16 bits the master buffer, which holds the parameters in
// reverse order (zero/flat_params.cpp) and padded, so they load only scrambled and are refused.
constexpr int64_t kPhaseTwoLayout = 2;

void check_phase_two_layout(const ExtraState& saved) {
  auto it = saved.per_rank.find("layout");
  const bool marked = it != saved.per_rank.end();
  const int64_t layout = marked ? it->second.item<int64_t>() : 1;
  if (layout == kPhaseTwoLayout) return;
  throw CheckpointError(
      "ZeroOneAdam: the checkpoint's per-rank phase-2 state (optimizer_extra.per_rank/"
      "local_updates, params, exp_avg, synced_params) has layout " + std::to_string(layout) +
      (marked ? "" : " (no \"layout\" entry: saved by an earlier version, in 16 bits as the "
                     "flat master's buffer, reversed and padded)") +
      ", this version reads layout " + std::to_string(kPhaseTwoLayout) +
      " (per parameter, in the model's order); resume with the version that saved it, or from a "
      "checkpoint saved before phase 2 (at a step <= var_freeze_step + 1)");
}

}  // namespace

ZeroOneAdam::ZeroOneAdam(std::vector<torch::Tensor> params, const ZeroOneAdamHyper& hyper,
                         comm::CommunicatorPtr comm)
    : FusedAdam(std::move(params),
                uncorrected_adamw_hyper(hyper)),
      hyper_(hyper),
      comm_(std::move(comm)) {}

int64_t ZeroOneAdam::steps() const { return adamw_steps(*this); }

// The stage asks before the backward, step() replays the schedule only after it: when the step
// count moved since this optimizer's last step (a load that did not hand back the extra state),
// answer from the schedule step() is about to replay, or the stage would keep a variance step's
// gradients local and exact Adam would run on each rank's own (ranks diverge). Not frozen here,
// so the replay is at most var_freeze_step steps.
bool ZeroOneAdam::gradients_stay_local() const {
  if (frozen()) return true;
  int64_t interval = var_interval_;
  if (steps() != last_step_) {
    int64_t counter = 0;
    interval = 1;
    for (int64_t t = 1; t <= steps(); ++t)
      advance_var_interval(t, hyper_.var_update_scaler, interval, counter);
  }
  return (steps() + 1) % interval != 0;
}

// Every parameter with its Adam state (created, zero, when missing: every rank must compress the
// same tensors whatever its graph used).
std::vector<ZeroOneAdam::Param> ZeroOneAdam::params_with_state() {
  std::vector<Param> out;
  for (auto& group : param_groups()) {
    auto* o = static_cast<torch::optim::AdamWOptions*>(&group.options());
    for (auto& p : group.params()) out.push_back({p, &adamw_state_or_zeros(*this, p, steps()), o});
  }
  return out;
}

void ZeroOneAdam::compress(const std::vector<at::Tensor>& tensors) {
  if (!comm_ || comm_->world_size() == 1) return;  // the average of one rank is itself
  const auto views = exchange_views(tensors);
  if (!compressor_) compressor_ = compressor_for(comm_, views);
  compressor_->run(views);  // COLLECTIVE
}

// exp_avg_mask on the exchanged tensors, per parameter (a view each with segments).
void ZeroOneAdam::apply_masks(std::vector<at::Tensor>& tensors) const {
  auto views = exchange_views(tensors);
  for (size_t i = 0; i < views.size(); ++i) apply_mask(i, views[i]);
}

// Phase 1, not a variance step: the momentum takes the compressed average of the gradients.
void ZeroOneAdam::compressed_gradient_step() {
  auto params = params_with_state();
  std::vector<at::Tensor> grads;
  for (auto& x : params)
    grads.push_back(x.p.grad().defined() ? x.p.grad().clone() : torch::zeros_like(x.p));
  compress(grads);
  apply_masks(grads);
  for (size_t i = 0; i < params.size(); ++i) {
    auto& [p, s, o] = params[i];
    s->step(s->step() + 1);
    s->exp_avg().mul_(std::get<0>(o->betas())).add_(grads[i], 1 - std::get<0>(o->betas()));
    at::Tensor update = s->exp_avg() / (s->exp_avg_sq().sqrt() + o->eps());
    if (o->weight_decay() > 0) update.add_(p, o->weight_decay());
    p.add_(update, -o->lr());
  }
}

// Phase 2: a local step, and every local_interval steps the synchronisation.
void ZeroOneAdam::local_step(int64_t step) {
  auto params = params_with_state();
  if (u_.empty())
    for (auto& x : params) {
      u_.push_back(torch::zeros_like(x.p));
      synced_.push_back(x.p.clone());
    }
  for (size_t i = 0; i < params.size(); ++i) {
    auto& [p, s, o] = params[i];
    s->step(s->step() + 1);
    const double beta1 = std::get<0>(o->betas());
    s->exp_avg().mul_(beta1);
    if (p.grad().defined()) s->exp_avg().add_(p.grad(), 1 - beta1);
    at::Tensor update = s->exp_avg() / (s->exp_avg_sq().sqrt() + o->eps());
    if (o->weight_decay() > 0) update.add_(p, o->weight_decay());
    p.add_(update, -o->lr());
    u_[i].add_(update, -o->lr());
  }
  lr_sum_ += params.empty() ? 0.0 : params[0].options->lr();
  if (step % local_interval_ != 0) return;  // no communication this step
  std::vector<at::Tensor> denoms;
  for (size_t i = 0; i < params.size(); ++i) {
    auto& [p, s, o] = params[i];
    denoms.push_back(s->exp_avg_sq().sqrt() + o->eps());
    u_[i].mul_(denoms[i]);  // into momentum units
  }
  compress(u_);
  apply_masks(u_);
  for (size_t i = 0; i < params.size(); ++i) {
    auto& [p, s, o] = params[i];
    s->exp_avg().copy_(u_[i]).div_(-lr_sum_);
    // The local updates are undone by going back to the parameters of the last sync (DeepSpeed
    // subtracts u instead, which leaves each rank its own rounding residue: ranks drift apart
    // by ~1e-7 per sync; this way they stay bit-identical).
    p.copy_(synced_[i] + u_[i] / denoms[i]);
    synced_[i].copy_(p);
    u_[i].zero_();
  }
  lr_sum_ = 0;
}

// The interval bookkeeping after step `step` (DeepSpeed's, moved out of the update).
// Phase 1 runs through step var_freeze_step + 1 (DeepSpeed freezes after a step whose count
// exceeds var_freeze_step), phase 2 from the next.
void ZeroOneAdam::advance_schedule(int64_t step) {
  if (step <= hyper_.var_freeze_step + 1) {
    advance_var_interval(step, hyper_.var_update_scaler, var_interval_, var_counter_);
    // The switch: the error feedback kept for gradients must not leak into the momentum sums.
    if (step == hyper_.var_freeze_step + 1 && compressor_) compressor_->reset_errors();
    return;
  }
  if (++local_counter_ == hyper_.local_step_scaler) {
    local_counter_ = 0;
    local_interval_ = std::min(hyper_.local_step_clipper, local_interval_ * 2);
  }
}

void ZeroOneAdam::replay_schedule(int64_t steps) {
  var_interval_ = 1;
  var_counter_ = 0;
  local_interval_ = 1;
  local_counter_ = 0;
  for (int64_t t = 1; t <= steps; ++t) advance_schedule(t);
  lr_sum_ = 0;
  u_.clear();
  synced_.clear();
  if (compressor_) compressor_->reset_errors();
}

ExtraState ZeroOneAdam::extra_state() const {
  ExtraState out;
  if (compressor_) compressor_->save_errors(out);
  if (u_.empty()) return out;  // phase 2 not begun: parameters and momentum equal on every rank
  std::vector<at::Tensor> params, momenta;
  for (const auto& group : param_groups())
    for (const auto& p : group.params()) {
      params.push_back(p);
      auto it = state().find(compat::optimizer_state_key(p));
      TORCH_CHECK(it != state().end(), "ZeroOneAdam: a parameter has no state in phase 2");
      momenta.push_back(static_cast<const torch::optim::AdamWParamState&>(*it->second).exp_avg());
    }
  // Per parameter in the model's order (exchange_views: with segments, the master's segments),
  // whatever the precision (kPhaseTwoLayout).
  out.per_rank["layout"] = torch::tensor({kPhaseTwoLayout}, torch::kLong);
  out.per_rank["params"] = concat_flat(exchange_views(params));
  out.per_rank["exp_avg"] = concat_flat(exchange_views(momenta));
  out.per_rank["local_updates"] = concat_flat(exchange_views(u_));
  out.per_rank["synced_params"] = concat_flat(exchange_views(synced_));
  out.per_rank["lr_sum"] = torch::tensor({lr_sum_}, torch::kDouble);
  return out;
}

// The error feedback, and in phase 2 the local updates u and the parameters of the last sync
// (one fp32 each per parameter element).
int64_t ZeroOneAdam::extra_state_bytes() const {
  return (compressor_ ? compressor_->error_bytes() : 0) + storage_bytes_of(u_) +
         storage_bytes_of(synced_);
}

void ZeroOneAdam::load_extra_state(const ExtraState& saved) {
  if (saved.per_rank.count("local_updates")) check_phase_two_layout(saved);  // before any change
  replay_schedule(steps());  // intervals from the step count; u, Σlr and the errors cleared
  last_step_ = steps();
  if (saved.per_rank.count("worker_error")) {
    std::vector<at::Tensor> params;
    for (auto& x : params_with_state()) params.push_back(x.p);
    if (!compressor_) compressor_ = compressor_for(comm_, exchange_views(params));
    compressor_->restore_errors(saved);
  }
  if (!saved.per_rank.count("local_updates")) return;
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> params, momenta;
  for (auto& x : params_with_state()) {
    params.push_back(x.p);
    momenta.push_back(x.state->exp_avg());
    u_.push_back(torch::zeros_like(x.p));
    synced_.push_back(torch::zeros_like(x.p));
  }
  // As extra_state() laid them out; with segments the master's padding is not touched.
  copy_from_flat(saved.per_rank.at("params"), exchange_views(params), "params");
  copy_from_flat(saved.per_rank.at("exp_avg"), exchange_views(momenta), "exp_avg");
  copy_from_flat(saved.per_rank.at("local_updates"), exchange_views(u_), "local_updates");
  copy_from_flat(saved.per_rank.at("synced_params"), exchange_views(synced_), "synced_params");
  lr_sum_ = saved.per_rank.at("lr_sum").item<double>();
}

torch::Tensor ZeroOneAdam::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss = run_closure(closure);
  if (steps() != last_step_) replay_schedule(steps());  // a checkpoint was loaded
  const int64_t step = steps() + 1;
  if (frozen()) {
    local_step(step);
  } else if (step % var_interval_ == 0) {
    FusedAdam::step();  // a variance step: the stage all-reduced the gradients
  } else {
    compressed_gradient_step();
  }
  advance_schedule(step);
  last_step_ = steps();
  return loss;
}

}  // namespace optim
}  // namespace deepspeed
