#include "optim/lion.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <limits>

#include "deepspeed/errors.h"
#include "optim/adamw_state.h"
#include "optim/param_reader.h"
#include "util/torch_compat.h"

namespace deepspeed {
namespace optim {
namespace {

// The host pass over one tensor. Each product and sum is rounded on its own, in the order the
// tensor operations below take, so that the two paths agree bit for bit: fp-contract off keeps
// the compiler from fusing a product and a sum into an FMA where the target has one
// (-march=native), and noinline keeps the loop out of callers compiled without it. (Pushed and
// popped: in a unity batch the setting must not reach the files after this one.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
__attribute__((noinline)) void lion_host_pass(float* p, const float* g, float* m, int64_t begin,
                                              int64_t end, float lr, float decay, float b1,
                                              float one_minus_b1, float b2, float one_minus_b2) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
  for (int64_t k = begin; k < end; ++k) {
    const float c = m[k] * b1 + g[k] * one_minus_b1;
    const float sign = static_cast<float>((c > 0.0f) - (c < 0.0f));
    p[k] = p[k] * decay + (-lr) * sign;  // (-lr)·sign is exact: ±lr or 0
    m[k] = m[k] * b2 + g[k] * one_minus_b2;
  }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

bool host_pass_fits(const at::Tensor& t) {
  return t.is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous();
}

}  // namespace

LionHyper parse_lion_params(const OptimizerConfig& config) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  ParamReader r(config.params, "optimizer.params");
  if (r.has("max_grad_norm"))
    throw ConfigError(r.path("max_grad_norm") +
                      " is not supported as an optimizer parameter; use the top-level "
                      "\"gradient_clipping\" key instead");
  LionHyper h;
  h.lr = r.get_double("lr", h.lr);
  auto betas = r.get_list("betas", {h.beta1, h.beta2}, 2);
  h.beta1 = betas[0];
  h.beta2 = betas[1];
  h.weight_decay = r.get_double("weight_decay", h.weight_decay);
  // FusedLion's and DeepSpeedCPULion's flags: no effect here (zero_grad sets gradients to none
  // as it is; the state is fp32, the masters' dtype, either way: docs/config.md).
  r.get_bool("set_grad_none", true);
  r.get_bool("fp32_optimizer_states", true);
  reject_unread(r, "Lion");
  check_range(r, "lr", h.lr, 0, kInf);
  check_range(r, "betas[0]", h.beta1, 0, 1);
  check_range(r, "betas[1]", h.beta2, 0, 1);
  check_range(r, "weight_decay", h.weight_decay, 0, kInf);
  return h;
}

LionOptions lion_options(const LionHyper& h) {
  return LionOptions(h.lr).betas(std::make_tuple(h.beta1, h.beta2)).weight_decay(h.weight_decay);
}

void LionOptions::serialize(torch::serialize::OutputArchive& archive) const {
  archive.write("lr", c10::IValue(lr()));
  archive.write("beta1", c10::IValue(std::get<0>(betas())));
  archive.write("beta2", c10::IValue(std::get<1>(betas())));
  archive.write("weight_decay", c10::IValue(weight_decay()));
}

void LionOptions::serialize(torch::serialize::InputArchive& archive) {
  auto read = [&](const char* key) {
    c10::IValue v;
    archive.read(key, v);
    return v.toDouble();
  };
  lr(read("lr"));
  const double b1 = read("beta1");
  betas(std::make_tuple(b1, read("beta2")));
  weight_decay(read("weight_decay"));
}

void LionParamState::serialize(torch::serialize::OutputArchive& archive) const {
  archive.write("step", c10::IValue(step()));
  archive.write("exp_avg", exp_avg(), /*is_buffer=*/true);
}

void LionParamState::serialize(torch::serialize::InputArchive& archive) {
  c10::IValue s;
  archive.read("step", s);
  step(s.toInt());
  at::Tensor m;
  archive.read("exp_avg", m, /*is_buffer=*/true);
  exp_avg(m);
}

Lion::Lion(std::vector<torch::optim::OptimizerParamGroup> groups, const LionOptions& defaults)
    : torch::optim::Optimizer(std::move(groups), std::make_unique<LionOptions>(defaults)) {}

Lion::Lion(std::vector<torch::Tensor> params, const LionHyper& hyper)
    : Lion({torch::optim::OptimizerParamGroup(std::move(params))}, lion_options(hyper)) {}

// The state of a group added later (add_param_group) is made at its first step, as for p.
LionParamState& Lion::state_of(const torch::Tensor& p) {
  auto key = compat::optimizer_state_key(p);
  auto it = state().find(key);
  if (it == state().end()) {
    auto s = std::make_unique<LionParamState>();
    s->exp_avg(torch::zeros_like(p, at::MemoryFormat::Contiguous));
    it = state().emplace(key, std::move(s)).first;
  }
  return static_cast<LionParamState&>(*it->second);
}

torch::Tensor Lion::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss = run_closure(closure);
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const LionOptions&>(group.options());
    // The step's scalars in fp32 arithmetic, as DeepSpeed's kernels compute them (1 - β1 of a
    // float β1; 1 - lr·wd).
    const float lr = static_cast<float>(o.lr()), wd = static_cast<float>(o.weight_decay());
    const float b1 = static_cast<float>(std::get<0>(o.betas()));
    const float b2 = static_cast<float>(std::get<1>(o.betas()));
    const float omb1 = 1.0f - b1, omb2 = 1.0f - b2, decay = 1.0f - lr * wd;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const at::Tensor& g = p.grad();
      TORCH_CHECK(!g.is_sparse(), "Lion: sparse gradients are not supported");
      TORCH_CHECK(g.numel() == p.numel(), "Lion: a gradient of ", g.numel(),
                  " elements for a parameter of ", p.numel());
      auto& s = state_of(p);
      s.step(s.step() + 1);
      at::Tensor& m = s.exp_avg();
      TORCH_CHECK(m.numel() == p.numel(), "Lion: a momentum (exp_avg) of ", m.numel(),
                  " elements for a parameter of ", p.numel(), " (a state loaded for another "
                  "partition?)");
      if (!tensor_ops_on_host_ && host_pass_fits(p) && host_pass_fits(g) && host_pass_fits(m)) {
        float* pp = p.data_ptr<float>();
        const float* gp = g.data_ptr<float>();
        float* mp = m.data_ptr<float>();
        at::parallel_for(0, p.numel(), 1 << 15, [&](int64_t begin, int64_t end) {
          lion_host_pass(pp, gp, mp, begin, end, lr, decay, b1, omb1, b2, omb2);
        });
        continue;
      }
      // The same arithmetic as tensor operations (a GPU, or another dtype or layout), with the
      // same fp32 scalars (a double holds each exactly; fp32 tensor kernels compute in fp32).
      at::Tensor c = (m * double(b1)).add_(g * double(omb1));
      if (decay != 1.0f) p.mul_(double(decay));
      p.add_(c.sign_(), -double(lr));
      m.mul_(double(b2)).add_(g * double(omb2));
    }
  }
  return loss;
}

void Lion::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<LionParamState, LionOptions>(archive, *this);
}

void Lion::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<LionParamState, LionOptions>(archive, *this);
}

}  // namespace optim
}  // namespace deepspeed
