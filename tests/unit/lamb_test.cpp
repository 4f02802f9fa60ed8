// Lamb (optim/lamb.h) against the plain reference Lamb written from DeepSpeed's FusedLamb kernel
// (support/reference_lamb.h), and the config refusals DeepSpeed makes for Lamb and the 1-bit
// optimizers. The multi-rank stages are in tests/dist/lamb_onebit_test.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>

#include "deepspeed/config.h"
#include "deepspeed/errors.h"
#include "deepspeed/optimizer.h"
#include "optim/lamb.h"
#include "optim/onebit_adam.h"
#include "optim/onebit_lamb.h"
#include "optim/zero_one_adam.h"
#include "optim/optimizer_params.h"
#include "support/reference_lamb.h"

namespace lamb_test {

using deepspeed::ConfigError;
using deepspeed::OptimizerConfig;
using deepspeed::optim::Lamb;
using deepspeed::optim::LambHyper;
using nlohmann::json;

namespace {

// Three tensors: a weight, a zero-initialised bias (trust ratio 1 on its first step) and a
// tiny-valued one whose ratio hits min_coeff.
std::vector<torch::Tensor> make_params() {
  torch::manual_seed(3);
  return {torch::randn({7, 5}), torch::zeros({5}), torch::randn({13}) * 1e-4};
}

std::vector<torch::Tensor> grads_at(int step) {
  torch::manual_seed(100 + step);
  return {torch::randn({7, 5}), torch::randn({5}) * 0.1, torch::randn({13}) * 10};
}

dstest::RefLambOptions ref_options(const LambHyper& h) {
  dstest::RefLambOptions o;
  o.lr = h.lr;
  o.beta1 = h.beta1;
  o.beta2 = h.beta2;
  o.eps = h.eps;
  o.weight_decay = h.weight_decay;
  o.bias_correction = h.bias_correction;
  o.eps_inside_sqrt = h.eps_inside_sqrt;
  o.max_coeff = h.max_coeff;
  o.min_coeff = h.min_coeff;
  return o;
}

// Runs `steps` steps of Lamb and the reference from the same start; returns the largest
// difference in values and in trust ratios.
std::pair<double, double> compare(const LambHyper& h, int steps) {
  auto ours = make_params(), ref = make_params();
  Lamb lamb(ours, h);
  dstest::ReferenceLamb reference(ref, ref_options(h));
  double value_diff = 0, coeff_diff = 0;
  for (int s = 0; s < steps; ++s) {
    auto g = grads_at(s);
    for (size_t i = 0; i < g.size(); ++i) {
      ours[i].mutable_grad() = g[i].clone();
      ref[i].mutable_grad() = g[i].clone();
    }
    lamb.step();
    reference.step();
    for (size_t i = 0; i < g.size(); ++i) {
      value_diff = std::max(value_diff, (ours[i] - ref[i]).abs().max().item<double>());
      coeff_diff = std::max(coeff_diff, std::abs(lamb.lamb_coeffs()[i] - reference.coeffs[i]));
    }
  }
  return {value_diff, coeff_diff};
}

std::string config_error(const json& doc) {
  try {
    deepspeed::parse_config(doc, 1);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no ConfigError>";
}

json lamb_config(int stage) {
  return {{"train_batch_size", 4},
          {"optimizer", {{"type", "Lamb"}, {"params", {{"lr", 1e-3}}}}},
          {"zero_optimization", {{"stage", stage}}}};
}

}  // namespace

TEST(Lamb, MatchesReferenceWithinOneMillionth) {
  LambHyper h;
  h.lr = 0.01;
  h.weight_decay = 0.05;
  auto [values, coeffs] = compare(h, 6);
  EXPECT_LT(values, 1e-6);
  EXPECT_LT(coeffs, 1e-6);
}

TEST(Lamb, MatchesReferenceWithoutBiasCorrectionAndEpsInsideSqrt) {
  LambHyper h;
  h.lr = 0.02;
  h.bias_correction = false;
  h.eps_inside_sqrt = true;
  h.eps = 1e-6;
  auto [values, coeffs] = compare(h, 5);
  EXPECT_LT(values, 1e-6);
  EXPECT_LT(coeffs, 1e-6);
}

TEST(Lamb, TrustRatioIsClampedAndOneForZeroWeights) {
  LambHyper h;
  h.lr = 0.01;
  h.max_coeff = 0.1;   // the weight's first ‖p‖/‖u‖ ≈ 0.2 (|u| ≈ 3 per element) is clamped down
  h.min_coeff = 0.05;  // the tiny tensor's ratio ≈ 1e-4 is clamped up
  auto params = make_params();
  Lamb lamb(params, h);
  auto g = grads_at(0);
  for (size_t i = 0; i < g.size(); ++i) params[i].mutable_grad() = g[i];
  lamb.step();
  ASSERT_EQ(lamb.lamb_coeffs().size(), 3u);
  EXPECT_DOUBLE_EQ(lamb.lamb_coeffs()[0], 0.1);
  EXPECT_DOUBLE_EQ(lamb.lamb_coeffs()[1], 1.0);  // ‖p‖ = 0: FusedLamb leaves the ratio at 1
  EXPECT_DOUBLE_EQ(lamb.lamb_coeffs()[2], 0.05);
  EXPECT_LT(compare(h, 4).first, 1e-6);
}

// One tensor holding the three parameters end to end, cut into fragments (as a ZeRO partition
// holds them), steps exactly as the three tensors do: the ratio uses whole-parameter norms.
TEST(Lamb, FragmentsOfOneTensorStepLikeSeparateTensors) {
  LambHyper h;
  h.lr = 0.01;
  h.weight_decay = 0.01;
  auto separate = make_params();
  std::vector<torch::Tensor> flat_parts;
  for (auto& p : separate) flat_parts.push_back(p.reshape({-1}));
  torch::Tensor flat = torch::cat(flat_parts);
  flat = torch::cat({flat, torch::zeros({3})});  // alignment padding: never updated
  Lamb whole(separate, h), fragmented({flat}, h);
  // Parameter 0 in two fragments, as if it straddled a partition boundary.
  fragmented.set_fragments({{0, 0, 20}, {0, 20, 15}, {1, 35, 5}, {2, 40, 13}}, 3,
                           [](at::Tensor&) {});
  for (int s = 0; s < 4; ++s) {
    auto g = grads_at(s);
    std::vector<torch::Tensor> flat_g;
    for (size_t i = 0; i < g.size(); ++i) {
      separate[i].mutable_grad() = g[i];
      flat_g.push_back(g[i].reshape({-1}));
    }
    flat.mutable_grad() = torch::cat({torch::cat(flat_g), torch::zeros({3})});
    whole.step();
    fragmented.step();
  }
  std::vector<torch::Tensor> now;
  for (auto& p : separate) now.push_back(p.reshape({-1}));
  EXPECT_LT((flat.narrow(0, 0, 53) - torch::cat(now)).abs().max().item<double>(), 1e-6);
  EXPECT_EQ(flat.narrow(0, 53, 3).abs().max().item<double>(), 0.0);
}

TEST(Lamb, ConfigParamsAreDeepSpeedsAndUnknownOnesNamed) {
  LambHyper h = deepspeed::optim::parse_lamb_params(
      OptimizerConfig{"Lamb", {{"lr", 0.1}, {"max_coeff", 5}, {"min_coeff", 0.1},
                               {"bias_correction", false}, {"eps_inside_sqrt", true}}});
  EXPECT_DOUBLE_EQ(h.max_coeff, 5);
  EXPECT_DOUBLE_EQ(h.min_coeff, 0.1);
  EXPECT_FALSE(h.bias_correction);
  EXPECT_TRUE(h.eps_inside_sqrt);
  LambHyper d = deepspeed::optim::parse_lamb_params(OptimizerConfig{"Lamb", json::object()});
  EXPECT_DOUBLE_EQ(d.max_coeff, 10.0);
  EXPECT_DOUBLE_EQ(d.min_coeff, 0.01);
  try {
    deepspeed::make_optimizer(OptimizerConfig{"lamb", {{"freeze_step", 3}}},
                              std::vector<at::Tensor>{torch::zeros({2})});
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.params.freeze_step"), std::string::npos)
        << e.what();
  }
  auto opt = deepspeed::make_optimizer(OptimizerConfig{"LAMB", json::object()},
                                       std::vector<at::Tensor>{torch::zeros({2})});
  EXPECT_NE(dynamic_cast<Lamb*>(opt.get()), nullptr);
}

TEST(Lamb, RefusalsNameBothKeys) {
  EXPECT_EQ(config_error(lamb_config(2)), "<no ConfigError>");
  auto msg = config_error(lamb_config(3));
  EXPECT_NE(msg.find("zero_optimization.stage = 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Lamb"), std::string::npos) << msg;
  json bf16 = lamb_config(1);
  bf16["bf16"] = {{"enabled", true}};
  msg = config_error(bf16);
  EXPECT_NE(msg.find("bf16.enabled"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dynamic loss scaling"), std::string::npos) << msg;
  json fp16 = lamb_config(0);
  fp16["fp16"] = {{"enabled", true}, {"loss_scale", 128}};
  msg = config_error(fp16);
  EXPECT_NE(msg.find("fp16.loss_scale"), std::string::npos) << msg;
  fp16["fp16"] = {{"enabled", true}};  // dynamic: allowed, as in DeepSpeed
  EXPECT_EQ(config_error(fp16), "<no ConfigError>");
}

TEST(OneBitAdamConfig, RefusedWithZeroNamingBothKeysAndParamsChecked) {
  for (const char* type : {"OneBitAdam", "onebitadam"}) {
    json doc = lamb_config(1);
    doc["optimizer"] = {{"type", type}, {"params", {{"freeze_step", 10}}}};
    auto msg = config_error(doc);
    EXPECT_NE(msg.find("zero_optimization.stage = 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("optimizer.type \"" + std::string(type) + "\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("not compatible with ZeRO"), std::string::npos) << msg;
  }
  auto h = deepspeed::optim::parse_onebit_adam_params(
      OptimizerConfig{"OneBitAdam", {{"freeze_step", 7}, {"cuda_aware", true},
                                     {"comm_backend_name", "mpi"}}});
  EXPECT_EQ(h.freeze_step, 7);
  EXPECT_TRUE(h.cuda_aware);
  try {
    deepspeed::optim::parse_onebit_adam_params(
        OptimizerConfig{"OneBitAdam", {{"comm_backend_name", "gloo2"}}});
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.params.comm_backend_name"), std::string::npos);
  }
  try {
    deepspeed::optim::parse_onebit_adam_params(
        OptimizerConfig{"OneBitAdam", {{"var_freeze_step", 7}}});
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.params.var_freeze_step"), std::string::npos);
  }
}

}  // namespace lamb_test
