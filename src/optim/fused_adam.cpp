#include "optim/fused_adam.h"

#include <torch/torch.h>

#include <stdexcept>

#include "device/out_of_memory.h"
#include "optim/adamw_state.h"
#include "optim/cpu_adam.h"
#include "optim/device_adam.h"
#include "util/torch_compat.h"

namespace deepspeed {
namespace optim {
FusedAdam::FusedAdam(std::vector<torch::Tensor> params, const AdamHyper& hyper)
    : torch::optim::Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                              std::make_unique<torch::optim::AdamWOptions>(adamw_options(hyper))),
      adamw_mode_(hyper.adamw_mode), bias_correction_(hyper.bias_correction) {}

void FusedAdam::set_half_copy(const torch::Tensor& param, torch::Tensor target) {
  TORCH_CHECK(target.numel() == param.numel() && target.is_contiguous() &&
                  (target.scalar_type() == torch::kBFloat16 || target.scalar_type() == torch::kHalf),
              "FusedAdam::set_half_copy: target must be a contiguous bf16/fp16 tensor of ",
              param.numel(), " elements");
  half_copies_[param.unsafeGetTensorImpl()] = std::move(target);
}

torch::optim::AdamWParamState& FusedAdam::state_of(const torch::Tensor& p) {
  auto key = compat::optimizer_state_key(p);
  auto it = state().find(key);
  if (it == state().end()) {
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->step(0);
    AllocatingFor naming("Adam's moments (exp_avg and exp_avg_sq, each)", -1, p.numel(),
                         p.element_size());
    s->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Contiguous));
    s->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Contiguous));
    it = state().emplace(key, std::move(s)).first;
  }
  return static_cast<torch::optim::AdamWParamState&>(*it->second);
}

AdamStepParams FusedAdam::hyper_for(const torch::optim::AdamWOptions& o, int64_t step) const {
  AdamStepParams hp;
  hp.lr = static_cast<float>(o.lr());
  hp.beta1 = static_cast<float>(std::get<0>(o.betas()));
  hp.beta2 = static_cast<float>(std::get<1>(o.betas()));
  hp.eps = static_cast<float>(o.eps());
  hp.weight_decay = static_cast<float>(o.weight_decay());
  hp.adamw_mode = adamw_mode_;
  hp.bias_correction = bias_correction_;
  hp.step = step;
  hp.grad_scale = grad_scale_;
  return hp;
}

AdamRangeStep FusedAdam::range_step_of(const torch::Tensor& p, torch::optim::AdamWParamState& s,
                                       const AdamStepParams& hp) {
  AdamRangeStep r;
  r.hyper = hp;
  r.param = p.data_ptr<float>();
  r.exp_avg = s.exp_avg().data_ptr<float>();
  r.exp_avg_sq = s.exp_avg_sq().data_ptr<float>();
  auto copy = half_copies_.find(p.unsafeGetTensorImpl());
  if (copy != half_copies_.end()) {
    r.half = static_cast<uint16_t*>(copy->second.data_ptr());
    r.kind = copy->second.scalar_type() == torch::kHalf ? Half16Kind::FP16 : Half16Kind::BF16;
  }
  return r;
}

void AdamRangeStep::run(const float* grad, int64_t begin, int64_t n) const {
  adam_step(param + begin, grad, exp_avg + begin, exp_avg_sq + begin, n, hyper,
            half ? half + begin : nullptr, kind);
}

void AdamRangeStep::run_into(const float* grad, int64_t begin, int64_t n, uint16_t* half_out,
                             Half16Kind out_kind) const {
  adam_step(param + begin, grad, exp_avg + begin, exp_avg_sq + begin, n, hyper, half_out,
            out_kind);
}

void FusedAdam::set_flat(const torch::Tensor& master, std::vector<Segment> segments) {
  auto& groups = param_groups();
  TORCH_CHECK(!groups.empty() && groups[0].params().size() == 1 && groups[0].params()[0].is_same(master),
              "FusedAdam::set_flat: group 0 must hold the master alone");
  for (size_t g = 1; g < groups.size(); ++g) groups[g].params().clear();
  for (const auto& s : segments)
    TORCH_CHECK(s.group < groups.size() && s.begin >= 0 && s.begin + s.numel <= master.numel(),
                "FusedAdam::set_flat: a segment outside the master or its groups");
  segments_ = std::move(segments);
}

namespace {
// The kernels read and write flat fp32 memory.
void check_fp32_contiguous(const torch::Tensor& p) {
  TORCH_CHECK(p.scalar_type() == torch::kFloat && p.is_contiguous() &&
                  p.grad().scalar_type() == torch::kFloat && p.grad().is_contiguous(),
              "FusedAdam needs contiguous fp32 parameters and gradients");
}
}  // namespace

// One step of the master, segment by segment, each with its group's options.
void FusedAdam::flat_step() {
  auto& groups = param_groups();
  torch::Tensor p = groups[0].params()[0];
  if (!p.grad().defined()) return;
  check_fp32_contiguous(p);
  auto& s = state_of(p);
  s.step(s.step() + 1);
  auto copy = half_copies_.find(p.unsafeGetTensorImpl());
  const at::Tensor grad = p.grad().view({-1});
  for (const auto& seg : segments_) {
    const AdamStepParams hp = hyper_for(
        static_cast<torch::optim::AdamWOptions&>(groups[seg.group].options()), s.step());
    if (!p.is_cpu()) {
      at::Tensor target = copy != half_copies_.end()
                              ? copy->second.view({-1}).narrow(0, seg.begin, seg.numel)
                              : at::Tensor();
      at::Tensor param = p.view({-1}).narrow(0, seg.begin, seg.numel);
      at::Tensor m = s.exp_avg().view({-1}).narrow(0, seg.begin, seg.numel);
      at::Tensor v = s.exp_avg_sq().view({-1}).narrow(0, seg.begin, seg.numel);
      device_adam_step(param, grad.narrow(0, seg.begin, seg.numel), m, v, hp, target,
                       grads_are_scratch_);
      continue;
    }
    range_step_of(p, s, hp).run(grad.data_ptr<float>() + seg.begin, seg.begin, seg.numel);
  }
}

AdamRangeStep FusedAdam::prepare_step(const torch::Tensor& param) {
  TORCH_CHECK(segments_.empty(), "FusedAdam::prepare_step: not with set_flat's groups");
  TORCH_CHECK(param.is_cpu() && param.scalar_type() == torch::kFloat && param.is_contiguous(),
              "FusedAdam::prepare_step needs a contiguous fp32 CPU parameter");
  for (auto& group : param_groups()) {
    for (auto& p : group.params()) {
      if (!p.is_same(param)) continue;
      auto& s = state_of(p);
      s.step(s.step() + 1);
      AdamRangeStep r = range_step_of(
          p, s, hyper_for(static_cast<torch::optim::AdamWOptions&>(group.options()), s.step()));
      grad_scale_ = 1.0f;
      grads_are_scratch_ = false;
      return r;
    }
  }
  throw std::logic_error("FusedAdam::prepare_step: the tensor is not a parameter of this optimizer");
}

torch::Tensor FusedAdam::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss = run_closure(closure);
  if (!segments_.empty()) {
    flat_step();
    grad_scale_ = 1.0f;
    grads_are_scratch_ = false;
    return loss;
  }
  for (auto& group : param_groups()) {
    auto& o = static_cast<torch::optim::AdamWOptions&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      check_fp32_contiguous(p);
      auto& s = state_of(p);
      s.step(s.step() + 1);
      const AdamStepParams hp = hyper_for(o, s.step());
      auto copy = half_copies_.find(p.unsafeGetTensorImpl());
      if (!p.is_cpu()) {
        at::Tensor target = copy != half_copies_.end() ? copy->second : at::Tensor();
        at::Tensor m = s.exp_avg(), v = s.exp_avg_sq();
        device_adam_step(p, p.grad(), m, v, hp, target, grads_are_scratch_);
        continue;
      }
      const AdamRangeStep r = range_step_of(p, s, hp);
      r.run(p.grad().data_ptr<float>(), 0, p.numel());
    }
  }
  grad_scale_ = 1.0f;
  grads_are_scratch_ = false;
  return loss;
}

}  // namespace optim
}  // namespace deepspeed
