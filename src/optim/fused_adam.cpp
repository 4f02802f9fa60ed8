#include "optim/fused_adam.h"

#include <torch/torch.h>

#include <algorithm>
#include <stdexcept>

#include "device/out_of_memory.h"
#include "optim/adamw_state.h"
#include "optim/cpu_adam.h"
#include "optim/device_adam.h"
#include "util/torch_compat.h"

namespace deepspeed {
namespace optim {
namespace {
// The CPU kernels' name for a tensor's dtype (fp32, bf16, fp16).
AdamElem elem_of_dtype(at::ScalarType t) {
  if (t == torch::kFloat) return AdamElem::F32;
  if (t == torch::kBFloat16) return AdamElem::BF16;
  TORCH_CHECK(t == torch::kHalf, "FusedAdam: no CPU kernel reads ", t, " buffers");
  return AdamElem::FP16;
}
}  // namespace

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

void FusedAdam::keep_moments_in(at::ScalarType dtype) {
  TORCH_CHECK(dtype == torch::kFloat || dtype == torch::kBFloat16,
              "FusedAdam::keep_moments_in: moments in fp32 or bf16, not ", dtype);
  moment_dtype_ = dtype;
}

at::ScalarType FusedAdam::moment_dtype_for(const torch::Tensor& param) const {
  return param.scalar_type() == torch::kFloat ? torch::kFloat : moment_dtype_;
}

torch::optim::AdamWParamState& FusedAdam::state_of(const torch::Tensor& p) {
  auto key = compat::optimizer_state_key(p);
  auto it = state().find(key);
  if (it == state().end()) {
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->step(0);
    const auto options = p.options().dtype(moment_dtype_for(p));
    AllocatingFor naming("Adam's moments (exp_avg and exp_avg_sq, each)", -1, p.numel(),
                         c10::elementSize(moment_dtype_for(p)));
    s->exp_avg(torch::zeros(p.sizes(), options));
    s->exp_avg_sq(torch::zeros(p.sizes(), options));
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
  r.state.param = p.data_ptr();
  r.state.param_format = elem_of_dtype(p.scalar_type());
  r.state.exp_avg = s.exp_avg().data_ptr();
  r.state.exp_avg_sq = s.exp_avg_sq().data_ptr();
  r.state.moment_format = elem_of_dtype(s.exp_avg().scalar_type());
  auto copy = half_copies_.find(p.unsafeGetTensorImpl());
  if (copy != half_copies_.end()) {
    r.half = static_cast<uint16_t*>(copy->second.data_ptr());
    r.kind = copy->second.scalar_type() == torch::kHalf ? Half16Kind::FP16 : Half16Kind::BF16;
  }
  return r;
}

namespace {
// One group: one kernel call, as without groups; else each run with its own hyper-parameters.
void step_range(const AdamRangeStep& r, const void* grad, AdamElem format, int64_t begin,
                int64_t n, uint16_t* half_out, Half16Kind out_kind) {
  if (r.runs.empty())
    adam_step_buffers(r.state.at(begin), grad, format, n, r.hyper, half_out, out_kind);
  else
    adam_step_runs(r.runs, r.state.at(begin), grad, format, begin, n, half_out, out_kind);
}
}  // namespace

void AdamRangeStep::run_grads(const void* grad, AdamElem format, int64_t begin, int64_t n) const {
  step_range(*this, grad, format, begin, n, half ? half + begin : nullptr, kind);
}

void AdamRangeStep::run_grads_into(const void* grad, AdamElem format, int64_t begin, int64_t n,
                                   uint16_t* half_out, Half16Kind out_kind) const {
  step_range(*this, grad, format, begin, n, half_out, out_kind);
}

void AdamRangeStep::set_num_threads(int n) {
  hyper.num_threads = n;
  for (auto& r : runs) r.hyper.num_threads = n;
}

void FusedAdam::set_flat(const torch::Tensor& master, std::vector<Segment> segments) {
  auto& groups = param_groups();
  TORCH_CHECK(!groups.empty() && groups[0].params().size() == 1 && groups[0].params()[0].is_same(master),
              "FusedAdam::set_flat: group 0 must hold the master alone");
  for (size_t g = 1; g < groups.size(); ++g) groups[g].params().clear();
  int64_t next = 0;
  for (const auto& s : segments) {
    TORCH_CHECK(s.group < groups.size() && s.begin == next && s.numel > 0,
                "FusedAdam::set_flat: the segments must cover the master in order, each in one "
                "of its groups; got [", s.begin, ", ", s.begin + s.numel, ") of group ", s.group,
                " where element ", next, " was next");
    next += s.numel;
  }
  TORCH_CHECK(segments.empty() || next == master.numel(),
              "FusedAdam::set_flat: the segments cover ", next, " of the master's ",
              master.numel(), " elements");
  segments_ = std::move(segments);
}

std::vector<AdamHyperRun> FusedAdam::segment_runs(int64_t step) {
  auto& groups = param_groups();
  std::vector<AdamHyperRun> runs;
  runs.reserve(segments_.size());
  for (const auto& seg : segments_)
    runs.push_back({seg.begin, seg.numel,
                    hyper_for(static_cast<torch::optim::AdamWOptions&>(groups[seg.group].options()),
                              step)});
  return runs;
}

namespace {
bool is_16bit(at::ScalarType t) { return t == torch::kBFloat16 || t == torch::kHalf; }
}  // namespace

bool FusedAdam::reads_grads_of(const torch::Tensor& param, at::ScalarType grad) {
  if (grad == torch::kFloat) return true;
  if (!is_16bit(grad)) return false;
  if (param.is_cpu()) return true;
  // A 16-bit master on a device is stepped a chunk at a time on widened copies
  // (device_adam_step_any_master), its 16-bit gradients widened with them where the kernel
  // cannot read them as they are: no copy of the whole partition either way.
  if (is_16bit(param.scalar_type())) return true;
  return param.is_cuda() && device_adam_reads_16bit_grads();
}

namespace {

// The kernels read and write flat memory: fp32 parameters, or 16-bit masters (keep_moments_in),
// and the gradients reads_grads_of allows.
void check_contiguous(const torch::Tensor& p) {
  const auto g = p.grad().scalar_type();
  TORCH_CHECK((p.scalar_type() == torch::kFloat || is_16bit(p.scalar_type())) &&
                  p.is_contiguous() && FusedAdam::reads_grads_of(p, g) && p.grad().is_contiguous(),
              "FusedAdam needs contiguous fp32 (or 16-bit master) parameters and gradients it can "
              "read (got ",
              p.scalar_type(), " parameters on ", p.device(), " with gradients of ", g, ")");
}

// A CPU step over the gradients as they are: fp32, or 16-bit widened in cache.
void run_on_cpu(const AdamRangeStep& r, const at::Tensor& grad, int64_t n) {
  r.run_grads(grad.data_ptr(), elem_of_dtype(grad.scalar_type()), 0, n);
}

}  // namespace

// One step of the master, segment by segment, each with its group's options.
void FusedAdam::flat_step() {
  auto& groups = param_groups();
  torch::Tensor p = groups[0].params()[0];
  if (!p.grad().defined()) return;
  check_contiguous(p);
  auto& s = state_of(p);
  s.step(s.step() + 1);
  const at::Tensor grad = p.grad().view({-1});
  std::vector<AdamHyperRun> runs = segment_runs(s.step());
  if (p.is_cpu()) {
    AdamRangeStep r = range_step_of(p, s, runs.front().hyper);
    r.runs = std::move(runs);
    run_on_cpu(r, grad, p.numel());
    return;
  }
  auto copy = half_copies_.find(p.unsafeGetTensorImpl());
  for (const auto& run : runs) {  // a fused kernel call per segment
    auto part = [&](const at::Tensor& t) { return t.view({-1}).narrow(0, run.begin, run.numel); };
    at::Tensor target = copy != half_copies_.end() ? part(copy->second) : at::Tensor();
    at::Tensor param = part(p), m = part(s.exp_avg()), v = part(s.exp_avg_sq());
    device_adam_step_any_master(param, part(grad), m, v, run.hyper, target, grads_are_scratch_);
  }
}

AdamRangeStep FusedAdam::prepare_step(const torch::Tensor& param) {
  TORCH_CHECK(param.is_cpu() && (param.scalar_type() == torch::kFloat ||
                                  is_16bit(param.scalar_type())) && param.is_contiguous(),
              "FusedAdam::prepare_step needs a contiguous fp32 (or 16-bit master) CPU parameter");
  for (auto& group : param_groups()) {
    for (auto& p : group.params()) {
      if (!p.is_same(param)) continue;
      auto& s = state_of(p);
      s.step(s.step() + 1);
      AdamRangeStep r = range_step_of(
          p, s, hyper_for(static_cast<torch::optim::AdamWOptions&>(group.options()), s.step()));
      if (!segments_.empty()) r.runs = segment_runs(s.step());  // (param is the master)
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
      check_contiguous(p);
      auto& s = state_of(p);
      s.step(s.step() + 1);
      const AdamStepParams hp = hyper_for(o, s.step());
      auto copy = half_copies_.find(p.unsafeGetTensorImpl());
      if (!p.is_cpu()) {
        at::Tensor target = copy != half_copies_.end() ? copy->second : at::Tensor();
        at::Tensor m = s.exp_avg(), v = s.exp_avg_sq();
        device_adam_step_any_master(p, p.grad(), m, v, hp, target, grads_are_scratch_);
        continue;
      }
      run_on_cpu(range_step_of(p, s, hp), p.grad(), p.numel());
    }
  }
  grad_scale_ = 1.0f;
  grads_are_scratch_ = false;
  return loss;
}

}  // namespace optim
}  // namespace deepspeed
