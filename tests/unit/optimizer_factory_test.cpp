// The "optimizer" block → libtorch optimizers: hyper-parameters, DeepSpeed's Adam/AdamW decay
// modes checked against a hand-computed step, and the errors that name the bad key.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/errors.h"
#include "deepspeed/optimizer.h"
#include "optim/fused_adam.h"
#include "optim/param_reader.h"

namespace optimizer_factory_test {

using deepspeed::AdamHyper;
using deepspeed::ConfigError;
using deepspeed::OptimizerConfig;
using nlohmann::json;

namespace {

std::shared_ptr<torch::optim::Optimizer> make(const std::string& type, json params,
                                              std::vector<torch::Tensor> p = {}) {
  if (p.empty()) p.push_back(torch::zeros({2}, torch::requires_grad()));
  return deepspeed::make_optimizer(OptimizerConfig{type, std::move(params)}, std::move(p));
}

template <class Options>
Options& options_of(torch::optim::Optimizer& opt, size_t group = 0) {
  auto* o = dynamic_cast<Options*>(&opt.param_groups().at(group).options());
  if (!o) throw std::runtime_error("unexpected options type");
  return *o;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no ConfigError>";
}

// One optimizer step on p = [1, -2] with grad [0.5, 0.1].
torch::Tensor one_step(const std::string& type, json params) {
  auto p = torch::tensor({1.0f, -2.0f}).requires_grad_();
  auto opt = make(type, std::move(params), {p});
  p.mutable_grad() = torch::tensor({0.5f, 0.1f});
  opt->step();
  return p.detach().clone();
}

}  // namespace

TEST(OptimizerFactory, AdamDefaultsAreFusedAdamsAndDecoupled) {
  auto opt = make("Adam", json::object());
  ASSERT_NE(dynamic_cast<torch::optim::AdamW*>(opt.get()), nullptr);
  auto& o = options_of<torch::optim::AdamWOptions>(*opt);
  EXPECT_DOUBLE_EQ(o.lr(), 1e-3);
  EXPECT_DOUBLE_EQ(std::get<0>(o.betas()), 0.9);
  EXPECT_DOUBLE_EQ(std::get<1>(o.betas()), 0.999);
  EXPECT_DOUBLE_EQ(o.eps(), 1e-8);
  EXPECT_DOUBLE_EQ(o.weight_decay(), 0.0);  // not libtorch AdamW's 1e-2
  EXPECT_FALSE(o.amsgrad());
}

TEST(OptimizerFactory, AdamHyperParametersAreApplied) {
  json params = {{"lr", 0.01},          {"betas", {0.8, 0.95}}, {"eps", 1e-6},
                 {"weight_decay", 0.1}, {"torch_adam", true},   {"adam_w_mode", true}};
  auto opt = make("adamw", params);  // case-insensitive
  auto& o = options_of<torch::optim::AdamWOptions>(*opt);
  EXPECT_DOUBLE_EQ(o.lr(), 0.01);
  EXPECT_DOUBLE_EQ(std::get<0>(o.betas()), 0.8);
  EXPECT_DOUBLE_EQ(std::get<1>(o.betas()), 0.95);
  EXPECT_DOUBLE_EQ(o.eps(), 1e-6);
  EXPECT_DOUBLE_EQ(o.weight_decay(), 0.1);

  AdamHyper h = deepspeed::parse_adam_params(OptimizerConfig{"AdamW", params});
  EXPECT_DOUBLE_EQ(h.lr, 0.01);
  EXPECT_DOUBLE_EQ(h.beta1, 0.8);
  EXPECT_DOUBLE_EQ(h.beta2, 0.95);
  EXPECT_DOUBLE_EQ(h.eps, 1e-6);
  EXPECT_DOUBLE_EQ(h.weight_decay, 0.1);
  EXPECT_TRUE(h.adamw_mode);
  EXPECT_TRUE(h.bias_correction);
}

TEST(OptimizerFactory, AdamWModeFalseGivesL2AdamOnlyForTypeAdam) {
  auto opt = make("Adam", {{"adam_w_mode", false}, {"weight_decay", 0.2}});
  ASSERT_NE(dynamic_cast<torch::optim::Adam*>(opt.get()), nullptr);
  EXPECT_DOUBLE_EQ(options_of<torch::optim::AdamOptions>(*opt).weight_decay(), 0.2);
  EXPECT_FALSE(deepspeed::parse_adam_params({"Adam", {{"adam_w_mode", false}}}).adamw_mode);

  // DeepSpeed: type AdamW is decoupled whatever adam_w_mode says.
  auto w = make("AdamW", {{"adam_w_mode", false}});
  EXPECT_NE(dynamic_cast<torch::optim::AdamW*>(w.get()), nullptr);
  EXPECT_TRUE(deepspeed::parse_adam_params({"AdamW", {{"adam_w_mode", false}}}).adamw_mode);
}

// First Adam step: m_hat = g, v_hat = g^2, so the update is lr * g / (|g| + eps).
TEST(OptimizerFactory, DecoupledAndL2DecayGiveTheirOwnFirstStep) {
  const double lr = 0.1, wd = 0.1, eps = 1e-8;
  auto adam_update = [&](double g) { return lr * g / (std::fabs(g) + eps); };

  auto w = one_step("Adam", {{"lr", lr}, {"weight_decay", wd}});
  EXPECT_NEAR(w[0].item<float>(), 1.0 * (1 - lr * wd) - adam_update(0.5), 1e-6);   // 0.89
  EXPECT_NEAR(w[1].item<float>(), -2.0 * (1 - lr * wd) - adam_update(0.1), 1e-6);  // -2.08

  // L2: g' = g + wd * p, so the second element's gradient flips sign (0.1 - 0.2).
  auto l2 = one_step("Adam", {{"lr", lr}, {"weight_decay", wd}, {"adam_w_mode", false}});
  EXPECT_NEAR(l2[0].item<float>(), 1.0 - adam_update(0.5 + wd * 1.0), 1e-6);    // 0.9
  EXPECT_NEAR(l2[1].item<float>(), -2.0 - adam_update(0.1 + wd * -2.0), 1e-6);  // -1.9
}

TEST(OptimizerFactory, SgdHyperParameters) {
  auto opt = make("sgd", {{"lr", 0.5},
                          {"momentum", 0.9},
                          {"dampening", 0.0},
                          {"weight_decay", 0.01},
                          {"nesterov", true}});
  ASSERT_NE(dynamic_cast<torch::optim::SGD*>(opt.get()), nullptr);
  auto& o = options_of<torch::optim::SGDOptions>(*opt);
  EXPECT_DOUBLE_EQ(o.lr(), 0.5);
  EXPECT_DOUBLE_EQ(o.momentum(), 0.9);
  EXPECT_DOUBLE_EQ(o.dampening(), 0.0);
  EXPECT_DOUBLE_EQ(o.weight_decay(), 0.01);
  EXPECT_TRUE(o.nesterov());

  auto d = make("SGD", {{"momentum", 0.5}, {"dampening", 0.1}});
  auto& od = options_of<torch::optim::SGDOptions>(*d);
  EXPECT_DOUBLE_EQ(od.lr(), 1e-3);
  EXPECT_DOUBLE_EQ(od.dampening(), 0.1);
  EXPECT_FALSE(od.nesterov());
}

TEST(OptimizerFactory, SgdStepIsPlainGradientDescent) {
  auto p = torch::tensor({1.0f, -2.0f}).requires_grad_();
  auto opt = make("SGD", {{"lr", 0.5}, {"weight_decay", 0.1}}, {p});
  p.mutable_grad() = torch::tensor({0.5f, 0.1f});
  opt->step();
  EXPECT_NEAR(p[0].item<float>(), 1.0 - 0.5 * (0.5 + 0.1 * 1.0), 1e-6);
  EXPECT_NEAR(p[1].item<float>(), -2.0 - 0.5 * (0.1 + 0.1 * -2.0), 1e-6);
}

TEST(OptimizerFactory, AdagradHyperParameters) {
  auto opt = make("Adagrad", {{"lr", 0.05},
                              {"lr_decay", 0.01},
                              {"weight_decay", 0.001},
                              {"initial_accumulator_value", 0.1},
                              {"eps", 1e-9}});
  auto& o = options_of<torch::optim::AdagradOptions>(*opt);
  EXPECT_DOUBLE_EQ(o.lr(), 0.05);
  EXPECT_DOUBLE_EQ(o.lr_decay(), 0.01);
  EXPECT_DOUBLE_EQ(o.weight_decay(), 0.001);
  EXPECT_DOUBLE_EQ(o.initial_accumulator_value(), 0.1);
  EXPECT_DOUBLE_EQ(o.eps(), 1e-9);
  EXPECT_DOUBLE_EQ(options_of<torch::optim::AdagradOptions>(*make("adagrad", {})).lr(), 1e-2);
}

TEST(OptimizerFactory, ParamGroupsKeepTheirOwnOptions) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{torch::zeros({2}, torch::requires_grad())});
  groups.emplace_back(std::vector<torch::Tensor>{torch::zeros({2}, torch::requires_grad())},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(0.5).weight_decay(0.0)));
  auto opt = deepspeed::make_optimizer({"AdamW", {{"lr", 0.01}, {"weight_decay", 0.1}}},
                                       std::move(groups));
  ASSERT_EQ(opt->param_groups().size(), 2u);
  EXPECT_DOUBLE_EQ(options_of<torch::optim::AdamWOptions>(*opt, 0).lr(), 0.01);
  EXPECT_DOUBLE_EQ(options_of<torch::optim::AdamWOptions>(*opt, 0).weight_decay(), 0.1);
  EXPECT_DOUBLE_EQ(options_of<torch::optim::AdamWOptions>(*opt, 1).lr(), 0.5);
  EXPECT_DOUBLE_EQ(options_of<torch::optim::AdamWOptions>(*opt, 1).weight_decay(), 0.0);
}

TEST(OptimizerFactory, NumbersAsStrings) {
  auto opt = make("Adam", {{"lr", "1e-2"}, {"adam_w_mode", "false"}});
  EXPECT_DOUBLE_EQ(options_of<torch::optim::AdamOptions>(*opt).lr(), 1e-2);
}

// Optimizer and scheduler booleans are read by the config's one rule (config/json_reader.h):
// true/false, "true"/"false" in any case, 1/0; other numbers and words name the key.
TEST(OptimizerFactory, BooleansReadLikeEveryConfigBoolean) {
  auto adamw_mode = [](json v) {
    return deepspeed::parse_adam_params({"Adam", {{"adam_w_mode", std::move(v)}}}).adamw_mode;
  };
  for (json off : {json(false), json("false"), json("FALSE"), json(" False "), json(0)})
    EXPECT_FALSE(adamw_mode(off)) << off.dump();
  for (json on : {json(true), json("TRUE"), json("tRuE"), json(1)})
    EXPECT_TRUE(adamw_mode(on)) << on.dump();
  for (json bad : {json(2), json(0.5), json(1.0), json("yes")}) {
    auto msg = error_of([&] { adamw_mode(bad); });
    EXPECT_NE(msg.find("optimizer.params.adam_w_mode"), std::string::npos) << msg;
    EXPECT_NE(msg.find("1 or 0"), std::string::npos) << msg;
  }
}

// DeepSpeed's torch_adam builds torch.optim.AdamW (decoupled: type AdamW, or Adam with the default
// adam_w_mode true) or torch.optim.Adam from the remaining keys, so an omitted weight_decay is
// torch's default: 0.01 for AdamW, 0 for Adam.
TEST(OptimizerFactory, TorchAdamTakesTorchsWeightDecayDefault) {
  auto wd = [](const std::string& type, json params) {
    return deepspeed::parse_adam_params({type, std::move(params)}).weight_decay;
  };
  EXPECT_DOUBLE_EQ(wd("AdamW", {{"torch_adam", true}}), 0.01);
  EXPECT_DOUBLE_EQ(wd("Adam", {{"torch_adam", true}}), 0.01);  // adam_w_mode defaults to true
  EXPECT_DOUBLE_EQ(wd("Adam", {{"torch_adam", true}, {"adam_w_mode", false}}), 0.0);
  EXPECT_DOUBLE_EQ(wd("AdamW", {{"torch_adam", true}, {"weight_decay", 0.0}}), 0.0);
  EXPECT_DOUBLE_EQ(wd("AdamW", {{"torch_adam", true}, {"weight_decay", 0.3}}), 0.3);
  EXPECT_DOUBLE_EQ(wd("AdamW", {{"torch_adam", false}}), 0.0);  // FusedAdam's default
  EXPECT_DOUBLE_EQ(wd("AdamW", json::object()), 0.0);
}

// Grad 0: the Adam update is 0 / (0 + eps) = 0, so one step is the decoupled decay alone,
// p *= 1 - lr * 0.01; both the libtorch AdamW of make_optimizer and the FusedAdam the engine
// builds from parse_adam_params.
TEST(OptimizerFactory, TorchAdamStepDecaysByTorchsDefault) {
  const json params = {{"lr", 0.1}, {"torch_adam", true}};
  auto p = torch::ones({3}).requires_grad_();
  auto opt = make("AdamW", params, {p});
  p.mutable_grad() = torch::zeros({3});
  opt->step();
  EXPECT_NEAR(p[0].item<float>(), 0.999, 1e-7);

  auto q = torch::ones({3}).requires_grad_();
  deepspeed::optim::FusedAdam fused({q}, deepspeed::parse_adam_params({"AdamW", params}));
  q.mutable_grad() = torch::zeros({3});
  fused.step();
  EXPECT_NEAR(q[0].item<float>(), 0.999, 1e-7);
}

// ---- errors ----

TEST(OptimizerFactoryErrors, UnknownTypeListsSupportedTypes) {
  auto msg = error_of([] { make("RMSpropX", {}); });
  EXPECT_NE(msg.find("optimizer.type"), std::string::npos) << msg;
  EXPECT_NE(msg.find("RMSpropX"), std::string::npos) << msg;
  for (const auto& t : deepspeed::supported_optimizers()) {
    EXPECT_NE(msg.find(t), std::string::npos) << t;
  }
  msg = error_of([] { make("MuAdamW", {}); });
  EXPECT_NE(msg.find("not implemented"), std::string::npos) << msg;
  EXPECT_EQ(deepspeed::canonical_optimizer_type("ADAMW"), "AdamW");
}

TEST(OptimizerFactoryErrors, UnknownParamIsAnErrorNamingIt) {
  auto msg = error_of([] { make("Adam", {{"lr", 0.1}, {"learning_rate", 0.1}}); });
  EXPECT_NE(msg.find("optimizer.params.learning_rate"), std::string::npos) << msg;
  msg = error_of([] { make("SGD", {{"betas", {0.9, 0.99}}}); });
  EXPECT_NE(msg.find("optimizer.params.betas"), std::string::npos) << msg;
  msg = error_of([] { make("Adagrad", {{"momentum", 0.9}}); });
  EXPECT_NE(msg.find("optimizer.params.momentum"), std::string::npos) << msg;
}

TEST(OptimizerFactoryErrors, MaxGradNormPointsToGradientClipping) {
  for (const char* type : {"Adam", "SGD"}) {
    auto msg = error_of([&] { make(type, {{"max_grad_norm", 1.0}}); });
    EXPECT_NE(msg.find("optimizer.params.max_grad_norm"), std::string::npos) << msg;
    EXPECT_NE(msg.find("gradient_clipping"), std::string::npos) << msg;
  }
}

TEST(OptimizerFactoryErrors, UnsupportedAdamVariants) {
  auto msg = error_of([] { make("Adam", {{"amsgrad", true}}); });
  EXPECT_NE(msg.find("optimizer.params.amsgrad"), std::string::npos) << msg;
  EXPECT_NO_THROW(make("Adam", {{"amsgrad", false}}));

  msg = error_of([] { make("Adam", {{"bias_correction", false}}); });
  EXPECT_NE(msg.find("optimizer.params.bias_correction"), std::string::npos) << msg;
  // The flat Adam of the ZeRO stages can do without bias correction: the hyper-parameters parse.
  EXPECT_FALSE(
      deepspeed::parse_adam_params({"Adam", {{"bias_correction", false}}}).bias_correction);
}

// torch.optim.AdamW/Adam, which torch_adam selects in DeepSpeed, take no bias_correction or
// set_grad_none (FusedAdam's keys): DeepSpeed fails there with a TypeError.
TEST(OptimizerFactoryErrors, TorchAdamRefusesFusedAdamOnlyKeys) {
  for (const char* key : {"bias_correction", "set_grad_none"}) {
    for (json value : {json(true), json(false)}) {
      auto msg = error_of([&] {
        deepspeed::parse_adam_params({"AdamW", {{"torch_adam", true}, {key, value}}});
      });
      EXPECT_NE(msg.find(std::string("optimizer.params.") + key), std::string::npos) << msg;
      EXPECT_NE(msg.find("optimizer.params.torch_adam"), std::string::npos) << msg;
    }
    EXPECT_NO_THROW(deepspeed::parse_adam_params({"AdamW", {{"torch_adam", false}, {key, true}}}));
  }
  // torch's Adam has AMSGrad; this project's update (FusedAdam's) has not.
  auto msg = error_of([] { make("Adam", {{"torch_adam", true}, {"amsgrad", true}}); });
  EXPECT_NE(msg.find("optimizer.params.amsgrad"), std::string::npos) << msg;
  EXPECT_NE(msg.find("torch_adam"), std::string::npos) << msg;
}

TEST(OptimizerFactoryErrors, BadValuesNameTheKey) {
  auto msg = error_of([] { make("Adam", {{"betas", {0.9, 0.99, 0.1}}}); });
  EXPECT_NE(msg.find("optimizer.params.betas"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected 2 value(s), got 3"), std::string::npos) << msg;
  // betas is a pair, not a list per parameter group; a per-group key (a scheduler's) says so.
  EXPECT_EQ(msg.find("parameter group"), std::string::npos) << msg;
  msg = error_of([] {
    deepspeed::optim::ParamReader r({{"warmup_min_lr", {0.0, 0.1, 0.2}}}, "scheduler.params");
    r.get_per_group("warmup_min_lr", 0.0, 2);
  });
  EXPECT_NE(msg.find("scheduler.params.warmup_min_lr: expected 2 value(s) (one per parameter "
                     "group), got 3"),
            std::string::npos)
      << msg;
  msg = error_of([] { make("Adam", {{"betas", {1.5, 0.99}}}); });
  EXPECT_NE(msg.find("optimizer.params.betas"), std::string::npos) << msg;
  msg = error_of([] { make("Adam", {{"betas", 0.9}}); });
  EXPECT_NE(msg.find("optimizer.params.betas"), std::string::npos) << msg;
  msg = error_of([] { make("Adam", {{"lr", "auto"}}); });
  EXPECT_NE(msg.find("optimizer.params.lr"), std::string::npos) << msg;
  EXPECT_NE(msg.find("auto"), std::string::npos) << msg;
  msg = error_of([] { make("AdamW", {{"weight_decay", -1}}); });
  EXPECT_NE(msg.find("optimizer.params.weight_decay"), std::string::npos) << msg;
  msg = error_of([] { make("Adam", {{"adam_w_mode", 2}}); });
  EXPECT_NE(msg.find("optimizer.params.adam_w_mode"), std::string::npos) << msg;
  msg = error_of([] { make("SGD", {{"nesterov", true}}); });
  EXPECT_NE(msg.find("optimizer.params.nesterov"), std::string::npos) << msg;
  msg = error_of([] { make("Adam", json::array()); });
  EXPECT_NE(msg.find("optimizer.params"), std::string::npos) << msg;
  msg = error_of([] { deepspeed::parse_adam_params({"SGD", {}}); });
  EXPECT_NE(msg.find("optimizer.type"), std::string::npos) << msg;
}

}  // namespace optimizer_factory_test
