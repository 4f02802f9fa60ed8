// Lion (optim/lion.h): the update against the paper's formulas done by hand in fp64, sign(0) = 0,
// the host pass against the tensor operations a GPU runs (bit for bit, and for strided
// gradients), threads, the archive round trip, and the "optimizer" block's keys and errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>

#include "deepspeed/errors.h"
#include "deepspeed/lr_scheduler.h"
#include "deepspeed/optimizer.h"
#include "optim/lion.h"
#include "support/expect.h"
#include "util/torch_compat.h"

namespace lion_test {

using deepspeed::ConfigError;
using deepspeed::OptimizerConfig;
using deepspeed::optim::Lion;
using deepspeed::optim::LionHyper;
using deepspeed::optim::LionOptions;
using deepspeed::optim::LionParamState;
using nlohmann::json;

namespace {

LionHyper hyper(double lr, double beta1, double beta2, double weight_decay) {
  LionHyper h;
  h.lr = lr;
  h.beta1 = beta1;
  h.beta2 = beta2;
  h.weight_decay = weight_decay;
  return h;
}

// The ConfigError parse_lion_params throws for `params`.
std::string error_of(const json& params) {
  return dstest::message_of<ConfigError>(
      [&] { deepspeed::optim::parse_lion_params(OptimizerConfig{"Lion", params}); });
}

LionParamState& state_of(Lion& opt, const torch::Tensor& p) {
  return static_cast<LionParamState&>(*opt.state().at(deepspeed::compat::optimizer_state_key(p)));
}

// `steps` steps of Lion over tensors of `sizes` (seeded), with the host pass or the tensor
// operations; returns each tensor's parameters and momentum after them.
std::vector<torch::Tensor> run(const LionHyper& h, const std::vector<int64_t>& sizes, int steps,
                               bool tensor_ops, bool strided_grads = false) {
  torch::manual_seed(3);
  std::vector<torch::Tensor> params;
  for (int64_t n : sizes) params.push_back(torch::randn({n}).requires_grad_());
  Lion opt(params, h);
  opt.use_tensor_ops_on_host(tensor_ops);
  for (int t = 0; t < steps; ++t) {
    for (auto& p : params) {
      const int64_t n = p.numel();
      torch::Tensor g = torch::randn({n}) * 0.1;
      // The same values, laid out as every other element of a buffer twice as long.
      if (strided_grads) g = torch::stack({g, torch::zeros({n})}, 1).select(1, 0);
      p.mutable_grad() = g;
    }
    opt.step();
  }
  std::vector<torch::Tensor> out;
  for (auto& p : params) {
    out.push_back(p.detach().clone());
    out.push_back(state_of(opt, p).exp_avg().clone());
  }
  return out;
}

}  // namespace

// DeepSpeed's FusedLion / DeepSpeedCPULion (Chen et al. 2023, Algorithm 2):
//   c = β1·m + (1-β1)·g;  p = p·(1 - lr·wd) - lr·sign(c);  m = β2·m + (1-β2)·g.
// Done here in fp64 on the same inputs. Tolerance: 1e-6 (the fp32 roundings of ~1e-7 relative);
// a step with the sign flipped moves p by 2·lr = 0.02, a dropped decay by lr·wd·|p| ~ 1e-3, m
// updated before c (Lion's order swapped) changes c's sign where |g - m| is large.
TEST(Lion, StepsEqualThePapersFormulasInDouble) {
  const LionHyper h = hyper(0.01, 0.9, 0.99, 0.1);
  const std::vector<int64_t> sizes = {5, 37};
  const int kSteps = 4;
  torch::manual_seed(8);
  std::vector<torch::Tensor> params, p64, m64;
  for (int64_t n : sizes) {
    params.push_back(torch::randn({n}).requires_grad_());
    p64.push_back(params.back().detach().to(torch::kDouble));
    m64.push_back(torch::zeros({n}, torch::kDouble));
  }
  Lion opt(params, h);
  double smallest_c = 1e300;
  for (int t = 0; t < kSteps; ++t) {
    for (size_t i = 0; i < params.size(); ++i) {
      torch::Tensor g = torch::randn({sizes[i]}) * 0.1;
      params[i].mutable_grad() = g;
      const torch::Tensor g64 = g.to(torch::kDouble);
      const torch::Tensor c = h.beta1 * m64[i] + (1 - h.beta1) * g64;
      smallest_c = std::min(smallest_c, c.abs().min().item<double>());
      p64[i] = p64[i] * (1 - h.lr * h.weight_decay) - h.lr * c.sign();
      m64[i] = h.beta2 * m64[i] + (1 - h.beta2) * g64;
    }
    opt.step();
    for (size_t i = 0; i < params.size(); ++i) {
      SCOPED_TRACE("step " + std::to_string(t + 1) + " tensor " + std::to_string(i));
      EXPECT_LT((params[i].detach().to(torch::kDouble) - p64[i]).abs().max().item<double>(), 1e-6);
      EXPECT_LT((state_of(opt, params[i]).exp_avg().to(torch::kDouble) - m64[i])
                    .abs().max().item<double>(), 1e-8);
      EXPECT_EQ(state_of(opt, params[i]).step(), t + 1);
    }
  }
  // No c so close to 0 that fp32 and fp64 could disagree on its sign.
  ASSERT_GT(smallest_c, 1e-5);
}

// A zero gradient on zero momentum: c = 0, sign 0, so only the decay moves p.
TEST(Lion, SignOfZeroMovesNothingButTheDecay) {
  const LionHyper h = hyper(0.5, 0.9, 0.999, 0.1);
  for (bool tensor_ops : {false, true}) {
    SCOPED_TRACE(tensor_ops ? "tensor operations" : "host pass");
    auto p = torch::tensor({1.0f, -2.0f, 0.0f}).requires_grad_();
    Lion opt({p}, h);
    opt.use_tensor_ops_on_host(tensor_ops);
    p.mutable_grad() = torch::zeros({3});
    opt.step();
    const float decay = 1.0f - 0.5f * 0.1f;  // in fp32, as DeepSpeed's kernels
    EXPECT_TRUE(torch::equal(p.detach(), torch::tensor({1.0f * decay, -2.0f * decay, 0.0f})))
        << p;
  }
}

// What a GPU runs (tensor operations) equals the host pass bit for bit; a strided gradient (no
// host pass) gives what its contiguous copy gives.
TEST(Lion, TensorOperationsAndStridedGradientsEqualTheHostPassBitForBit) {
  const LionHyper h = hyper(0.003, 0.95, 0.98, 0.2);
  const std::vector<int64_t> sizes = {7, 1000, 33};
  const auto host = run(h, sizes, 5, false);
  const auto ops = run(h, sizes, 5, true);
  const auto strided = run(h, sizes, 5, false, /*strided_grads=*/true);
  ASSERT_EQ(host.size(), ops.size());
  for (size_t k = 0; k < host.size(); ++k) {
    SCOPED_TRACE(std::string(k % 2 ? "momentum" : "parameters") + " of tensor " +
                 std::to_string(k / 2));
    EXPECT_TRUE(torch::equal(host[k], ops[k])) << (host[k] - ops[k]).abs().max();
    EXPECT_TRUE(torch::equal(host[k], strided[k])) << (host[k] - strided[k]).abs().max();
  }
}

// The host pass is split over intra-op threads: chunk edges must not skip or repeat elements.
TEST(Lion, ThreadsStepAsOneThread) {
  const LionHyper h = hyper(0.01, 0.9, 0.999, 0.01);
  const int before = at::get_num_threads();
  at::set_num_threads(1);
  const auto one = run(h, {300001}, 2, false);
  at::set_num_threads(3);
  const auto three = run(h, {300001}, 2, false);
  at::set_num_threads(before);
  for (size_t k = 0; k < one.size(); ++k) EXPECT_TRUE(torch::equal(one[k], three[k])) << k;
}

// save/load through libtorch's archive: the state comes back and the loaded optimizer steps as
// the saved one. (libtorch 1.13's load() restores the state, not the groups' options, 2.x's
// both; the engine reads the options from the archive itself, checkpoint_group_options.h,
// tested by LionEngine.ResumesBitForBitFromItsCheckpoint with other options configured.)
TEST(Lion, ArchiveRoundTripsTheState) {
  const LionHyper h = hyper(0.02, 0.8, 0.95, 0.05);
  auto a = torch::randn({6}).requires_grad_();
  Lion saved({a}, h);
  a.mutable_grad() = torch::randn({6});
  saved.step();
  saved.step();
  std::stringstream bytes;
  {
    torch::serialize::OutputArchive out;
    saved.save(out);
    out.save_to(bytes);
  }
  auto b = a.detach().clone().requires_grad_();
  Lion loaded({b}, h);  // no state yet
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  loaded.load(in);
  EXPECT_EQ(state_of(loaded, b).step(), 2);
  EXPECT_TRUE(torch::equal(state_of(loaded, b).exp_avg(), state_of(saved, a).exp_avg()));
  // The options' own round trip (what the engine's group reader calls).
  torch::serialize::OutputArchive options_out;
  saved.param_groups()[0].options().serialize(options_out);
  std::stringstream options_bytes;
  options_out.save_to(options_bytes);
  torch::serialize::InputArchive options_in;
  options_in.load_from(options_bytes);
  LionOptions read;
  read.serialize(options_in);
  EXPECT_EQ(read, static_cast<const LionOptions&>(saved.param_groups()[0].options()));
  b.mutable_grad() = a.grad().clone();
  saved.step();
  loaded.step();
  EXPECT_TRUE(torch::equal(a.detach(), b.detach()));
}

// LR schedulers drive it like Adam: lr per group, and betas (OneCycle's cycle_momentum).
TEST(Lion, SchedulersReachItsLrAndBetas) {
  auto opt = std::make_shared<Lion>(std::vector<torch::Tensor>{torch::zeros({2})}, LionHyper{});
  auto target = deepspeed::lr_target_for(opt);
  target->set_lr(0, 0.25);
  EXPECT_DOUBLE_EQ(opt->param_groups()[0].options().get_lr(), 0.25);
  ASSERT_TRUE(target->has_betas());
  target->set_betas(0, {0.85, 0.97});
  const auto& o = static_cast<const LionOptions&>(opt->param_groups()[0].options());
  EXPECT_EQ(o.betas(), std::make_tuple(0.85, 0.97));
}

TEST(LionConfig, DefaultsAreDeepSpeedsAndKeysAreChecked) {
  auto opt = deepspeed::make_optimizer(OptimizerConfig{"lion", json::object()},
                                       std::vector<torch::Tensor>{torch::zeros({2})});
  ASSERT_NE(dynamic_cast<Lion*>(opt.get()), nullptr);
  const auto& o = static_cast<const LionOptions&>(opt->param_groups()[0].options());
  EXPECT_DOUBLE_EQ(o.lr(), 1e-3);
  EXPECT_EQ(o.betas(), std::make_tuple(0.9, 0.999));
  EXPECT_DOUBLE_EQ(o.weight_decay(), 0.0);
  EXPECT_EQ(deepspeed::canonical_optimizer_type("LION"), "Lion");

  const json ok = {{"lr", 1e-4},          {"betas", {0.9, 0.99}},          {"weight_decay", 0.1},
                   {"set_grad_none", true}, {"fp32_optimizer_states", true}};
  const auto h = deepspeed::optim::parse_lion_params(OptimizerConfig{"Lion", ok});
  EXPECT_DOUBLE_EQ(h.lr, 1e-4);
  EXPECT_DOUBLE_EQ(h.beta2, 0.99);
  EXPECT_DOUBLE_EQ(h.weight_decay, 0.1);

  EXPECT_CONTAINS(error_of({{"eps", 1e-8}}), "optimizer.params.eps");
  EXPECT_CONTAINS(error_of({{"betas", {0.9, 1.5}}}), "betas[1]");
  EXPECT_CONTAINS(error_of({{"lr", -1}}), "optimizer.params.lr");
  EXPECT_CONTAINS(error_of({{"max_grad_norm", 1.0}}), "gradient_clipping");
}

}  // namespace lion_test
