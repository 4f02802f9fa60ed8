// 1-bit Lamb (optim/onebit_lamb.h):
//   - its warm-up is Lamb without bias correction, bit for bit, through the engine on 2 ranks;
//   - its frozen phase equals the formulas of DeepSpeed's OnebitLamb done by hand in fp64 here
//     (one rank, where the compressed average is the identity), running ratio average and
//     factor clamps included;
//   - after the freeze a step moves a small fraction of Lamb's bytes (its loss against Lamb's
//     after 200 steps: optimizer_convergence_test.cpp);
//   - frozen without coeff_freeze from a load, it rebuilds the ratios instead of stepping by 0;
//   - DeepSpeed's refusals and bad parameters are named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "deepspeed/config.h"
#include "deepspeed/errors.h"
#include "deepspeed/optimizer.h"
#include "optim/adamw_state.h"
#include "optim/onebit_lamb.h"
#include "support/training_run.h"

namespace onebit_lamb_test {

using dstest::base_config;
using dstest::RunSpec;
using dstest::train_gpt;
using nlohmann::json;

namespace {

constexpr double kLr = 0.03;  // Lamb's step is about lr of each weight's norm (lamb_onebit_test)

json lamb_config(const std::string& type, const json& extra) {
  json c = base_config(2, 1, 0);
  json params = {{"lr", kLr}, {"weight_decay", 0.01}};
  if (type == "Lamb") params["bias_correction"] = false;  // OnebitLamb never bias-corrects
  params.update(extra);
  c["optimizer"] = {{"type", type}, {"params", params}};
  return c;
}

// Lamb's ratio of `opt`'s state now, per tensor: clamp(|p| / |m/(sqrt(v)+eps) + wd*p|).
std::vector<double> lamb_ratios_now(deepspeed::optim::OneBitLamb& opt,
                                    const std::vector<torch::Tensor>& params,
                                    const deepspeed::optim::OneBitLambHyper& h) {
  std::vector<double> out;
  for (const auto& p : params) {
    auto& s = deepspeed::optim::adamw_state_or_zeros(opt, p, 0);
    torch::Tensor pd = p.detach().to(torch::kDouble);
    torch::Tensor u = s.exp_avg().to(torch::kDouble) /
                          (s.exp_avg_sq().to(torch::kDouble).sqrt() + h.eps) +
                      h.weight_decay * pd;
    out.push_back(std::clamp(pd.norm().item<double>() / u.norm().item<double>(), h.min_coeff,
                             h.max_coeff));
  }
  return out;
}

std::string config_error(const json& doc) {
  try {
    deepspeed::parse_config(doc, 2);
  } catch (const deepspeed::ConfigError& e) {
    return e.what();
  }
  return "<no ConfigError>";
}

}  // namespace

TEST(OneBitLamb, WarmupIsLambWithoutBiasCorrectionBitForBit) {
  RunSpec a, b;
  a.world_size = b.world_size = 2;
  a.steps = b.steps = 6;
  a.config = lamb_config("OneBitLamb", {{"freeze_step", 1000}});
  b.config = lamb_config("Lamb", json::object());
  auto onebit = train_gpt(a), lamb = train_gpt(b);
  EXPECT_EQ(dstest::max_weight_diff(onebit, lamb), 0.0);
  EXPECT_EQ(onebit.losses, lamb.losses);
}

// Two tensors, 3 warm-up and 5 frozen steps with drawn gradients, against DeepSpeed's formulas
// in fp64. Weight decay is on, so the update-ratio blend of the factor is exercised; the
// threshold clamp binds at the first frozen step (the drawn gradients make the fresh variance
// jump), the range clamp is checked through last_factor.
TEST(OneBitLamb, FrozenPhaseEqualsDeepSpeedsFormulasByHand) {
  deepspeed::optim::OneBitLambHyper h;
  h.lr = 0.01;
  h.weight_decay = 0.01;
  h.freeze_step = 3;
  const int kSteps = 8;
  torch::manual_seed(5);
  std::vector<torch::Tensor> params = {torch::randn({5}), torch::randn({37})};
  std::vector<std::vector<torch::Tensor>> grads(kSteps);
  for (auto& g : grads)
    for (auto& p : params) g.push_back(torch::randn(p.sizes()) * 0.1);
  // Reference state, fp64.
  std::vector<torch::Tensor> p, m, v, fresh;
  std::vector<double> cf(params.size(), 0.0), last(params.size(), 1.0);
  for (auto& x : params) {
    p.push_back(x.to(torch::kDouble));
    m.push_back(torch::zeros_like(p.back()));
    v.push_back(torch::zeros_like(p.back()));
    fresh.push_back(torch::zeros_like(p.back()));
  }
  std::vector<torch::Tensor> ours;
  for (auto& x : params) ours.push_back(x.clone().set_requires_grad(true));
  deepspeed::optim::OneBitLamb opt(ours, h, deepspeed::comm::make_single_process_communicator());
  const double b1 = h.beta1, b2 = h.beta2, eps = h.eps, wd = h.weight_decay;
  for (int t = 1; t <= kSteps; ++t) {
    for (size_t i = 0; i < ours.size(); ++i) ours[i].mutable_grad() = grads[t - 1][i].clone();
    opt.step();
    for (size_t i = 0; i < p.size(); ++i) {
      torch::Tensor g = grads[t - 1][i].to(torch::kDouble);
      torch::Tensor before = m[i].clone();
      m[i] = b1 * m[i] + (1 - b1) * g;
      if (t <= h.freeze_step) {
        v[i] = b2 * v[i] + (1 - b2) * g * g;
        torch::Tensor u = m[i] / (v[i].sqrt() + eps) + wd * p[i];
        double ratio = 1.0;
        const double wn = p[i].norm().item<double>(), un = u.norm().item<double>();
        if (wn != 0 && un != 0) ratio = std::clamp(wn / un, h.min_coeff, h.max_coeff);
        if (ratio != 1.0) cf[i] = h.coeff_beta * cf[i] + (1 - h.coeff_beta) * ratio;
        p[i] -= h.lr * ratio * u;
        if (t == h.freeze_step) fresh[i] = v[i].clone();
        continue;
      }
      torch::Tensor implied = (m[i] - b1 * before) / (1 - b1);
      fresh[i] = b2 * fresh[i] + (1 - b2) * implied * implied;
      torch::Tensor denom = v[i].sqrt() + eps;
      torch::Tensor prelim = m[i] / denom;
      torch::Tensor u = prelim + wd * p[i];
      double factor = (denom / (fresh[i].sqrt() + eps)).max().item<double>();
      const double r = std::min(1.0, prelim.norm().item<double>() / u.norm().item<double>());
      factor = factor * r + (1 - r);
      factor = std::clamp(factor, h.factor_min, h.factor_max);
      factor = std::clamp(factor, last[i] * (1 - h.factor_threshold),
                          last[i] * (1 + h.factor_threshold));
      last[i] = factor;
      p[i] -= h.lr * cf[i] * factor * u;
    }
    for (size_t i = 0; i < p.size(); ++i)
      EXPECT_LT((ours[i].detach().to(torch::kDouble) - p[i]).abs().max().item<double>(), 1e-6)
          << "tensor " << i << " after step " << t;
  }
  EXPECT_TRUE(opt.frozen());
  for (size_t i = 0; i < p.size(); ++i) {
    // fp32 arithmetic against fp64: agreement to ~1e-8 measured.
    EXPECT_NEAR(opt.coeff_freeze()[i], cf[i], 1e-6) << i;
    EXPECT_NEAR(opt.last_factor()[i], last[i], 1e-6) << i;
    EXPECT_GT(cf[i], 0.0);
  }
  std::cout << "coeff_freeze " << cf[0] << ", " << cf[1] << "; last factor " << last[0] << ", "
            << last[1] << "\n";
}

// Per step after the freeze: the difference of a 4-step and an 8-step run, both frozen after
// step 2 (as for 1-bit Adam in lamb_onebit_test.cpp). Lamb's step all-reduces 4 bytes per
// gradient; 1-bit Lamb's the packed signs and scales, (W+1)/(32W) of that at W = 2 in counted
// bytes, plus the loss's all-reduce.
TEST(OneBitLamb, StepAfterFreezeMovesAboutOneThirtySecondOfLambsBytes) {
  auto run = [](const json& config, int steps) {
    RunSpec s;
    s.world_size = 2;
    s.steps = steps;
    s.config = config;
    return dstest::rank0_traffic(s);
  };
  const json lamb = lamb_config("Lamb", json::object());
  const json onebit = lamb_config("OneBitLamb", {{"freeze_step", 2}});
  const double lamb_bytes = (run(lamb, 8).bytes - run(lamb, 4).bytes) / 4.0;
  const double bit_bytes = (run(onebit, 8).bytes - run(onebit, 4).bytes) / 4.0;
  std::cout << "per step after freeze: Lamb " << lamb_bytes << " B, 1-bit Lamb " << bit_bytes
            << " B, ratio " << bit_bytes / lamb_bytes << "\n";
  EXPECT_LT(bit_bytes / lamb_bytes, 3.0 / 64 * 1.25);
  EXPECT_GT(bit_bytes / lamb_bytes, 1.0 / 40);
}

// DeepSpeed's exp_avg_mask: masked elements keep no momentum after the freeze (so, without weight
// decay, they stop moving); bad uses are named.
TEST(OneBitLamb, ExpAvgMaskZeroesTheMaskedMomentumAfterTheFreeze) {
  deepspeed::optim::OneBitLambHyper h;
  h.lr = 0.01;
  h.freeze_step = 2;
  torch::manual_seed(3);
  torch::Tensor p = torch::randn({16}).set_requires_grad(true);
  deepspeed::optim::OneBitLamb opt({p}, h, deepspeed::comm::make_single_process_communicator());
  torch::Tensor mask = torch::ones({16});
  mask.narrow(0, 0, 8).zero_();
  deepspeed::set_exp_avg_mask(opt, p, mask);
  torch::Tensor frozen_at;
  for (int t = 1; t <= 6; ++t) {
    p.mutable_grad() = torch::randn({16});
    opt.step();
    if (t == 2) frozen_at = p.detach().clone();
  }
  torch::Tensor moved = (p.detach() - frozen_at).abs();
  EXPECT_EQ(moved.narrow(0, 0, 8).max().item<float>(), 0.0f);
  EXPECT_GT(moved.narrow(0, 8, 8).min().item<float>(), 0.0f);
  auto error_of = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const deepspeed::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("<no ConfigError>");
  };
  auto msg = error_of([&] { deepspeed::set_exp_avg_mask(opt, p, torch::ones({4})); });
  EXPECT_NE(msg.find("shape"), std::string::npos) << msg;
  msg = error_of([&] { deepspeed::set_exp_avg_mask(opt, torch::zeros({16}), mask); });
  EXPECT_NE(msg.find("not one of the optimizer's parameters"), std::string::npos) << msg;
  torch::optim::SGD sgd({p}, torch::optim::SGDOptions(0.1));
  msg = error_of([&] { deepspeed::set_exp_avg_mask(sgd, p, mask); });
  EXPECT_NE(msg.find("not a 1-bit optimizer"), std::string::npos) << msg;
}

// A load that restores the moments but no coeff_freeze (extra state skipped: another tensor-
// parallel size, a new trainable parameter with load_module_strict=false; or saved by plain Lamb)
// left the frozen ratio average at 0, so every later step was p -= 0. It is rebuilt from the
// loaded state as Lamb's ratio, and the weights move.
TEST(OneBitLamb, FrozenWithoutSavedRatiosRebuildsThemFromTheLoadedState) {
  deepspeed::optim::OneBitLambHyper h;
  h.lr = 0.01;
  h.weight_decay = 0.01;
  h.freeze_step = 2;
  torch::manual_seed(11);
  std::vector<torch::Tensor> params = {torch::randn({5}).set_requires_grad(true),
                                       torch::randn({37}).set_requires_grad(true)};
  deepspeed::optim::OneBitLamb opt(params, h, deepspeed::comm::make_single_process_communicator());
  auto draw_grads = [&] {
    for (auto& p : params) p.mutable_grad() = torch::randn(p.sizes()) * 0.1;
  };
  for (int t = 1; t <= 4; ++t) {
    draw_grads();
    opt.step();
  }
  ASSERT_TRUE(opt.frozen());
  opt.load_extra_state({});  // what a load hands back when the checkpoint's extra state is absent
  const std::vector<double> expected = lamb_ratios_now(opt, params, h);
  std::vector<torch::Tensor> before;
  for (auto& p : params) before.push_back(p.detach().clone());
  draw_grads();
  opt.step();
  ASSERT_EQ(opt.lamb_coeffs().size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_GT((params[i].detach() - before[i]).abs().max().item<double>(), 0.0) << i;
    EXPECT_GT(opt.lamb_coeffs()[i], 0.0) << i;
    EXPECT_NEAR(opt.coeff_freeze()[i], expected[i], 1e-6) << i;
  }
}

// The same for an optimizer built fresh, whose Adam state a load set without calling
// load_extra_state at all (checkpoint_load.cpp skips it), in 16 bits' layout: one flat tensor
// with segments that arrive after construction, so its per-segment ratios are sized at a step
// count > 0 (before, refused as "the segments changed").
TEST(OneBitLamb, FreshSegmentedOptimizerGivenOnlyAdamStateRebuildsTheRatios) {
  const std::vector<int64_t> sizes = {5, 37}, offsets = {0, 8};
  deepspeed::optim::OneBitLambHyper h;
  h.lr = 0.01;
  h.weight_decay = 0.01;
  h.freeze_step = 2;
  torch::manual_seed(12);
  std::vector<torch::Tensor> model;  // the model parameters the segments name
  std::vector<deepspeed::optim::Lamb::Fragment> fragments;
  std::vector<std::pair<int64_t, int64_t>> segments;
  torch::Tensor flat = torch::zeros({48});
  for (size_t i = 0; i < sizes.size(); ++i) {
    model.push_back(torch::zeros({sizes[i]}));
    flat.narrow(0, offsets[i], sizes[i]).copy_(torch::randn({sizes[i]}));
    fragments.push_back({static_cast<int64_t>(i), offsets[i], sizes[i]});
    segments.emplace_back(offsets[i], sizes[i]);
  }
  auto comm = deepspeed::comm::make_single_process_communicator();
  auto make = [&](const torch::Tensor& master) {
    auto opt = std::make_unique<deepspeed::optim::OneBitLamb>(std::vector<torch::Tensor>{master},
                                                              h, comm);
    opt->set_fragments(fragments, static_cast<int64_t>(sizes.size()), nullptr);
    opt->set_segments(model, segments);
    return opt;
  };
  auto trained = make(flat);
  for (int t = 1; t <= 4; ++t) {
    flat.mutable_grad() = torch::randn({48}) * 0.1;
    trained->step();
  }
  ASSERT_TRUE(trained->frozen());
  // A new engine's optimizer: the weights and the Adam state loaded, nothing else.
  torch::Tensor master = flat.detach().clone().set_requires_grad(true);
  auto resumed = make(master);
  auto& from = deepspeed::optim::adamw_state_or_zeros(*trained, flat, 0);
  auto& to = deepspeed::optim::adamw_state_or_zeros(*resumed, master, from.step());
  to.exp_avg().copy_(from.exp_avg());
  to.exp_avg_sq().copy_(from.exp_avg_sq());
  ASSERT_TRUE(resumed->frozen());
  std::vector<double> expected;
  for (size_t i = 0; i < sizes.size(); ++i) {
    torch::Tensor p = master.detach().narrow(0, offsets[i], sizes[i]).to(torch::kDouble);
    torch::Tensor m = to.exp_avg().narrow(0, offsets[i], sizes[i]).to(torch::kDouble);
    torch::Tensor v = to.exp_avg_sq().narrow(0, offsets[i], sizes[i]).to(torch::kDouble);
    torch::Tensor u = m / (v.sqrt() + h.eps) + h.weight_decay * p;
    expected.push_back(std::clamp(p.norm().item<double>() / u.norm().item<double>(), h.min_coeff,
                                  h.max_coeff));
  }
  torch::Tensor before = master.detach().clone();
  master.mutable_grad() = torch::randn({48}) * 0.1;
  resumed->step();
  ASSERT_EQ(resumed->coeff_freeze().size(), sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_GT((master.detach() - before).narrow(0, offsets[i], sizes[i]).abs().max().item<double>(),
              0.0)
        << i;
    EXPECT_GT(resumed->lamb_coeffs()[i], 0.0) << i;
    EXPECT_NEAR(resumed->coeff_freeze()[i], expected[i], 1e-6) << i;
  }
}

TEST(OneBitLambConfig, RefusedWithZeroAndBadParamsNamed) {
  json doc = base_config(2, 1, 2);
  doc["optimizer"] = {{"type", "OneBitLamb"}, {"params", {{"freeze_step", 10}}}};
  auto msg = config_error(doc);
  EXPECT_NE(msg.find("zero_optimization.stage = 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("optimizer.type \"OneBitLamb\""), std::string::npos) << msg;
  using deepspeed::OptimizerConfig;
  auto error_of = [](const json& params) {
    try {
      deepspeed::optim::parse_onebit_lamb_params(OptimizerConfig{"OneBitLamb", params});
    } catch (const deepspeed::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("<no ConfigError>");
  };
  msg = error_of({{"factor_max", 0.4}});
  EXPECT_NE(msg.find("optimizer.params.factor_max"), std::string::npos) << msg;
  msg = error_of({{"coeff_beta", 1.5}});
  EXPECT_NE(msg.find("optimizer.params.coeff_beta"), std::string::npos) << msg;
  msg = error_of({{"var_freeze_step", 3}});
  EXPECT_NE(msg.find("optimizer.params.var_freeze_step"), std::string::npos) << msg;
  auto h = deepspeed::optim::parse_onebit_lamb_params(
      OptimizerConfig{"OneBitLamb", {{"freeze_step", 7}, {"coeff_beta", 0.8}, {"factor_min", 0.2}}});
  EXPECT_EQ(h.freeze_step, 7);
  EXPECT_DOUBLE_EQ(h.coeff_beta, 0.8);
  EXPECT_DOUBLE_EQ(h.factor_min, 0.2);
  EXPECT_DOUBLE_EQ(h.factor_max, 4.0);
}

}  // namespace onebit_lamb_test
