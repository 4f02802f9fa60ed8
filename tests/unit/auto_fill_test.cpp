// "auto" filled from ConfigOverrides by the Hugging Face integration's rules: the HF ZeRO-2/ZeRO-3
// templates with "auto" everywhere parse to the same Config as their hand-filled twins; explicit
// values that disagree are errors (or kept, with fill_only); an "auto" with nothing to fill it
// stays an error naming the key.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "deepspeed/config.h"
#include "deepspeed/errors.h"
#include "support/expect.h"

namespace auto_fill_test {

using deepspeed::Config;
using deepspeed::ConfigError;
using deepspeed::ConfigOverrides;
using deepspeed::parse_config;
using nlohmann::json;

namespace {

// transformers/tests/deepspeed/ds_config_zero2.json, as HF ships it.
const char* kHfZero2 = R"({
  "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000,
           "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
  "bf16": {"enabled": "auto"},
  "optimizer": {"type": "AdamW",
                "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
  "scheduler": {"type": "WarmupLR",
                "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                           "warmup_num_steps": "auto"}},
  "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true},
                        "allgather_partitions": true, "allgather_bucket_size": 2e8,
                        "overlap_comm": true, "reduce_scatter": true,
                        "reduce_bucket_size": "auto", "contiguous_gradients": true},
  "gradient_accumulation_steps": "auto",
  "gradient_clipping": "auto",
  "steps_per_print": 2000,
  "train_batch_size": "auto",
  "train_micro_batch_size_per_gpu": "auto",
  "wall_clock_breakdown": false
})";

// transformers/tests/deepspeed/ds_config_zero3.json (WarmupDecayLR variant).
const char* kHfZero3 = R"({
  "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000,
           "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
  "bf16": {"enabled": "auto"},
  "optimizer": {"type": "AdamW",
                "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
  "scheduler": {"type": "WarmupDecayLR",
                "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                           "warmup_num_steps": "auto", "total_num_steps": "auto"}},
  "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": true},
                        "offload_param": {"device": "cpu", "pin_memory": true},
                        "overlap_comm": true, "contiguous_gradients": true,
                        "sub_group_size": 1e9, "reduce_bucket_size": "auto",
                        "stage3_prefetch_bucket_size": "auto",
                        "stage3_param_persistence_threshold": "auto",
                        "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
                        "stage3_gather_16bit_weights_on_model_save": true},
  "gradient_accumulation_steps": "auto",
  "gradient_clipping": "auto",
  "steps_per_print": 2000,
  "train_batch_size": "auto",
  "train_micro_batch_size_per_gpu": "auto",
  "wall_clock_breakdown": false
})";

// A trainer's arguments: lr 3e-5, betas (0.9, 0.98), eps 1e-6, wd 0.1, clip 0.5, bf16, warm-up
// 100 of 1000 steps, micro batch 4, accumulation 2, hidden size 768.
ConfigOverrides trainer() {
  ConfigOverrides o;
  o.train_micro_batch_size_per_gpu = 4;
  o.gradient_accumulation_steps = 2;
  o.learning_rate = 3e-5;
  o.betas = std::make_pair(0.9, 0.98);
  o.eps = 1e-6;
  o.weight_decay = 0.1;
  o.gradient_clipping = 0.5;
  o.fp16 = false;
  o.bf16 = true;
  o.warmup_steps = 100;
  o.total_steps = 1000;
  o.hidden_size = 768;
  return o;
}

// The same template as HF's layer leaves it after filling from trainer() on 2 ranks.
json filled_by_hand(json doc) {
  doc["fp16"]["enabled"] = false;
  doc["bf16"]["enabled"] = true;
  doc["optimizer"]["params"] = {
      {"lr", 3e-5}, {"betas", {0.9, 0.98}}, {"eps", 1e-6}, {"weight_decay", 0.1}};
  auto& sp = doc["scheduler"]["params"];
  sp["warmup_min_lr"] = 0;
  sp["warmup_max_lr"] = 3e-5;
  sp["warmup_num_steps"] = 100;
  if (sp.contains("total_num_steps")) sp["total_num_steps"] = 1000;
  auto& z = doc["zero_optimization"];
  z["reduce_bucket_size"] = 768 * 768;
  if (z["stage"] == 3) {
    z["stage3_prefetch_bucket_size"] = 530841;  // int(0.9 * 768^2)
    z["stage3_param_persistence_threshold"] = 7680;
  }
  doc["gradient_clipping"] = 0.5;
  doc["train_micro_batch_size_per_gpu"] = 4;
  doc["gradient_accumulation_steps"] = 2;
  doc["train_batch_size"] = 16;
  return doc;
}

std::string error_of(const json& doc, const ConfigOverrides& over) {
  return dstest::message_of<ConfigError>([&] { parse_config(doc, 2, over); });
}

}  // namespace

class HfTemplate : public ::testing::TestWithParam<const char*> {};

TEST_P(HfTemplate, FilledLikeTheHandFilledTwin) {
  json doc = json::parse(GetParam());
  std::vector<std::string> warnings;
  Config filled = parse_config(doc, 2, trainer(), &warnings);
  Config twin = parse_config(filled_by_hand(doc), 2, {}, &warnings);
  EXPECT_EQ(filled.raw, twin.raw);  // every key, as training uses it
  EXPECT_EQ(filled.train_batch_size, 16);
  EXPECT_TRUE(filled.bf16.enabled);
  EXPECT_FALSE(filled.fp16.enabled);
  EXPECT_DOUBLE_EQ(filled.gradient_clipping, 0.5);
  EXPECT_EQ(filled.zero_optimization.reduce_bucket_size, 768 * 768);
  EXPECT_EQ(filled.optimizer->params, twin.optimizer->params);
  EXPECT_EQ(filled.scheduler->params, twin.scheduler->params);
  if (filled.zero_optimization.stage == 3) {
    EXPECT_EQ(filled.zero_optimization.stage3_prefetch_bucket_size, 530841);
    EXPECT_EQ(filled.zero_optimization.stage3_param_persistence_threshold, 7680);
  }
  // Every "auto" is reported with its value.
  std::map<std::string, json> reported(filled.auto_filled.begin(), filled.auto_filled.end());
  EXPECT_EQ(reported["optimizer.params.lr"], 3e-5);
  EXPECT_EQ(reported["optimizer.params.betas"], json({0.9, 0.98}));
  EXPECT_EQ(reported["scheduler.params.warmup_min_lr"], 0);
  EXPECT_EQ(reported["zero_optimization.reduce_bucket_size"], 768 * 768);
  EXPECT_EQ(reported["bf16.enabled"], true);
  EXPECT_EQ(reported["train_batch_size"], 16);
  EXPECT_EQ(reported.count("steps_per_print"), 0u);
}

INSTANTIATE_TEST_SUITE_P(Zero2And3, HfTemplate, ::testing::Values(kHfZero2, kHfZero3));

TEST(AutoFill, AKeyLeftAutoIsNamed) {
  ConfigOverrides o = trainer();
  o.hidden_size.reset();
  o.warmup_steps.reset();
  std::string msg = error_of(json::parse(kHfZero3), o);
  // Without hidden_size the ZeRO sizes keep DeepSpeed's defaults, with a warning
  // (config_test's ConfigAuto.LeftoverZeroSizesKeepTheirDefaultsWithAWarning).
  EXPECT_EQ(msg.find("zero_optimization.reduce_bucket_size"), std::string::npos) << msg;
  EXPECT_CONTAINS(msg, "scheduler.params.warmup_num_steps");
  EXPECT_CONTAINS(msg, "hidden_size");  // says what would fill it
  EXPECT_EQ(msg.find("optimizer.params.lr"), std::string::npos) << msg;
}

TEST(AutoFill, ExplicitValuesMustAgreeLikeHf) {
  json doc = json::parse(kHfZero2);
  doc["optimizer"]["params"]["lr"] = 1e-4;
  doc["gradient_clipping"] = 1.0;
  doc["optimizer"]["params"]["eps"] = "1e-6";  // same value, written as a string: agrees
  std::string msg = error_of(doc, trainer());
  EXPECT_NE(
      msg.find("optimizer.params.lr = 0.0001 but initialize() was given learning_rate = 3e-05"),
      std::string::npos)
      << msg;
  EXPECT_NE(msg.find("gradient_clipping = 1.0 but initialize() was given gradient_clipping = 0.5"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("optimizer.params.eps"), std::string::npos) << msg;
  EXPECT_CONTAINS(msg, "write \"auto\"");
}

TEST(AutoFill, FillOnlyKeepsExplicitValues) {
  json doc = json::parse(kHfZero2);
  doc["optimizer"]["params"]["lr"] = 1e-4;
  doc["train_micro_batch_size_per_gpu"] = 8;
  ConfigOverrides o = trainer();
  o.fill_only = true;
  Config c = parse_config(doc, 2, o);
  EXPECT_DOUBLE_EQ(c.optimizer->params["lr"].get<double>(), 1e-4);
  EXPECT_DOUBLE_EQ(c.scheduler->params["warmup_max_lr"].get<double>(), 3e-5);  // was "auto"
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 8);
  EXPECT_EQ(c.train_batch_size, 32);  // 8 * 2 * 2 ranks
}

TEST(AutoFill, OnlyPresentKeysAreTouched) {
  // HF fills a key only where the config has it: no optimizer/scheduler blocks appear.
  json doc = {{"train_batch_size", 8}, {"gradient_clipping", "auto"}};
  Config c = parse_config(doc, 1, trainer());
  EXPECT_FALSE(c.optimizer.has_value());
  EXPECT_FALSE(c.scheduler.has_value());
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 0.5);
  ASSERT_EQ(c.auto_filled.size(), 1u);
  EXPECT_EQ(c.auto_filled[0].first, "gradient_clipping");
}

TEST(AutoFill, BadHiddenSizeIsNamed) {
  ConfigOverrides o = trainer();
  o.hidden_size = 0;
  EXPECT_NE(error_of(json::parse(kHfZero2), o).find("hidden_size = 0"), std::string::npos);
}

// HF's documented apex block: HF fills amp.enabled with (fp16_backend == "apex"), false unless the
// trainer runs apex, which deepspeed.cpp does not offer. So "auto" is false here, with no
// override needed; amp.opt_level is then unused and stays as written. amp.enabled true is still
// refused (config_policy_test).
TEST(AutoFill, AmpEnabledAutoIsOffAsHfFillsIt) {
  json doc = {{"train_batch_size", 8}, {"amp", {{"enabled", "auto"}, {"opt_level", "auto"}}}};
  for (const ConfigOverrides& o : {ConfigOverrides{}, trainer()}) {
    Config c = parse_config(doc, 1, o);
    EXPECT_EQ(c.raw["amp"]["enabled"], false);
    std::map<std::string, json> reported(c.auto_filled.begin(), c.auto_filled.end());
    EXPECT_EQ(reported["amp.enabled"], false);
  }
  // fp16 from the trainer is PyTorch's native AMP (HF's "amp" backend), not apex.
  ConfigOverrides fp16;
  fp16.fp16 = true;
  doc["fp16"] = {{"enabled", "auto"}};
  Config c = parse_config(doc, 1, fp16);
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_EQ(c.raw["amp"]["enabled"], false);
}

}  // namespace auto_fill_test
