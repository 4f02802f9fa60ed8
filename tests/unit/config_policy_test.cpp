// Block policies of ds_config.json (docs/config.md, "Block policies"): unknown keys inside the
// blocks DeepSpeed models strictly are errors, elsewhere warnings; blocks for features that are
// not provided warn or refuse when switched on, once, naming the block.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "deepspeed/config.h"
#include "deepspeed/errors.h"
#include "support/expect.h"

namespace deepspeed {
namespace config_policy_test {

using nlohmann::json;

json with(const json& extra) {
  json doc = {{"train_batch_size", 8}};
  doc.merge_patch(extra);
  return doc;
}

std::string error_of(const json& doc) {
  std::vector<std::string> warnings;
  try {
    parse_config(doc, 1, {}, &warnings);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError for " << doc.dump();
  return "";
}

std::vector<std::string> warnings_of(const json& doc) {
  std::vector<std::string> warnings;
  parse_config(doc, 1, {}, &warnings);
  return warnings;
}

// {"a": {"b": {key: value}}} from the path "a.b".
json nest(const std::string& path, const json& leaf) {
  size_t dot = path.find('.');
  if (dot == std::string::npos) return {{path, leaf}};
  return {{path.substr(0, dot), nest(path.substr(dot + 1), leaf)}};
}

// ---- strict blocks ------------------------------------------------------------------------------

TEST(ConfigStrictBlocks, UnknownKeyInEachStrictBlockIsAnError) {
  const char* blocks[] = {"zero_optimization",
                          "zero_optimization.offload_optimizer",
                          "zero_optimization.offload_param",
                          "tensorboard",
                          "csv_monitor",
                          "wandb",
                          "comet",
                          "comms_logger",
                          "aio",
                          "hybrid_engine",
                          "timers.throughput",
                          "tensor_parallel",
                          "tensor_parallel.tp",
                          "weight_quantization"};
  for (const std::string block : blocks) {
    json doc = with(nest(block, {{"comm_overlap", true}}));
    if (block.rfind("zero_optimization.", 0) == 0) doc["zero_optimization"]["stage"] = 3;
    std::string msg = error_of(doc);
    EXPECT_CONTAINS(msg, "unknown config key '" + block + ".comm_overlap'") << block;
    EXPECT_CONTAINS(msg, "DeepSpeed rejects unknown keys inside '" + block + "'") << block;
  }
}

TEST(ConfigStrictBlocks, MisspeltKeyKeepsTheSuggestion) {
  std::string msg = error_of(
      with({{"zero_optimization", {{"stage", 3}, {"stage3_param_persitence_threshold", 1000}}}}));
  EXPECT_CONTAINS(msg,
                  "unknown config key 'zero_optimization.stage3_param_persitence_threshold' (did "
                  "you mean 'zero_optimization.stage3_param_persistence_threshold'?)");
}

TEST(ConfigStrictBlocks, EveryUnknownKeyOfTheBlockIsListed) {
  std::string msg =
      error_of(with({{"tensorboard", {{"enabled", true}, {"outputpath", "x"}, {"jobname", "y"}}}}));
  EXPECT_CONTAINS(msg, "'tensorboard.outputpath' (did you mean 'tensorboard.output_path'?)");
  EXPECT_CONTAINS(msg, "'tensorboard.jobname' (did you mean 'tensorboard.job_name'?)");
}

TEST(ConfigStrictBlocks, KnownKeysOfTheStrictBlocksAreAccepted) {
  json doc = with({{"wandb", {{"enabled", false}, {"group", "g"}, {"team", "t"}, {"project", "p"}}},
                   {"comet",
                    {{"enabled", false},
                     {"samples_log_interval", 50},
                     {"project", "p"},
                     {"workspace", "w"},
                     {"api_key", "k"},
                     {"experiment_name", "e"},
                     {"experiment_key", nullptr},
                     {"online", false},
                     {"mode", "get_or_create"}}},
                   {"hybrid_engine",
                    {{"enabled", false},
                     {"max_out_tokens", 512},
                     {"inference_tp_size", 1},
                     {"release_inference_cache", false},
                     {"pin_parameters", true},
                     {"tp_gather_partition_size", 8}}},
                   {"timers", {{"throughput", {{"enabled", true}, {"synchronized", false}}}}},
                   {"tensor_parallel", {{"autotp_size", 0}, {"tp", {{"tp_size", 1}}}}},
                   {"weight_quantization", {{"enabled", false}, {"num_bits", 8}}}});
  EXPECT_TRUE(warnings_of(doc).empty());
}

TEST(ConfigStrictBlocks, WrongTypeInAStrictBlockNamesTheKey) {
  EXPECT_CONTAINS(error_of(with({{"comet", {{"samples_log_interval", "often"}}}})),
                  "config key 'comet.samples_log_interval' has value \"often\"");
}

TEST(ConfigLenientBlocks, UnknownKeysStillWarn) {
  auto warnings = warnings_of(with({{"gradient_cliping", 1.0},
                                    {"activation_checkpointing", {{"enabled", true}}},
                                    {"timers", {{"other", 1}}}}));
  ASSERT_EQ(warnings.size(), 3u);
  EXPECT_CONTAINS(warnings[0], "unknown config key 'activation_checkpointing.enabled'");
  EXPECT_CONTAINS(warnings[1], "unknown config key 'timers.other'");
  EXPECT_CONTAINS(warnings[2], "unknown config key 'gradient_cliping' (did you mean");
}

// ---- blocks for features that are not provided --------------------------------------------------

struct Switched {
  const char* block;  // JSON to merge
  const char* key;    // the key the message names
  bool refused;
  const char* says;  // part of the message
};

TEST(ConfigUnprovidedBlocks, EachSwitchedOnBlockIsWarnedOnceOrRefused) {
  const Switched cases[] = {
      {R"({"amp": {"enabled": true, "opt_level": "O1"}})", "amp.enabled", true, "bf16"},
      {R"({"wandb": {"enabled": true, "project": "p"}})", "wandb.enabled", false,
       "use \"tensorboard\" or \"csv_monitor\""},
      {R"({"comet": {"enabled": true}})", "comet.enabled", false,
       "nothing is sent to Comet; use \"tensorboard\" or \"csv_monitor\""},
      {R"({"comms_config": {"enabled": true}})", "comms_config", false, "comms_logger"},
      {R"({"nebula": {"enabled": true, "persistent_storage_path": "/x"}})", "nebula.enabled", false,
       "save_checkpoint()"},
      {R"({"autotuning": {"enabled": true}})", "autotuning.enabled", false,
       "trains with the config exactly as written"},
      {R"({"compression_training": {"sparse_pruning": {"shared_parameters": {"enabled": true}}}})",
       "compression_training.sparse_pruning.shared_parameters.enabled", true,
       "Compression library"},
      {R"({"compression_training": {"layer_reduction": {"enabled": true}}})",
       "compression_training.layer_reduction.enabled", true, "uncompressed model"},
      // DeepSpeed's engine consults only the inner switches, so each alone is refused.
      {R"({"data_efficiency": {"data_sampling": {"curriculum_learning": {"enabled": true}}}})",
       "data_efficiency.data_sampling.curriculum_learning.enabled", true,
       "curriculum learning by data difficulty (DeepSpeed's curriculum data sampler) is not "
       "provided"},
      {R"({"data_efficiency": {"data_routing": {"random_ltd": {"enabled": true}}}})",
       "data_efficiency.data_routing.random_ltd.enabled", true, "random-LTD) is not provided"},
      {R"({"hybrid_engine": {"enabled": true}})", "hybrid_engine.enabled", false,
       "training is unaffected"},
      {R"({"progressive_layer_drop": {"enabled": true, "theta": 0.5}})",
       "progressive_layer_drop.enabled", true, "Progressive Layer Drop"},
      {R"({"curriculum_learning": {"enabled": true}})", "curriculum_learning.enabled", true,
       "curriculum"},
      {R"({"elasticity": {"enabled": true}})", "elasticity.enabled", true, "batch size"},
      {R"({"quantize_training": {"enabled": true}})", "quantize_training.enabled", true, "MoQ"},
      // DeepSpeed's autotp_size groups ranks that read the same samples: refused rather than
      // trained as data parallelism with another global batch.
      {R"({"tensor_parallel": {"autotp_size": 2}})", "tensor_parallel.autotp_size", true,
       "InitializeArgs.topology"},
      {R"({"tensor_parallel": {"tp": {"tp_size": 2}}})", "tensor_parallel.tp.tp_size", false,
       "not read by training"},
      {R"({"weight_quantization": {"num_bits": 4}})", "weight_quantization", false,
       "weights stay unquantized"},
  };
  for (const Switched& c : cases) {
    json doc = with(json::parse(c.block));
    if (c.refused) {
      std::string msg = error_of(doc);
      EXPECT_CONTAINS(msg, std::string("'") + c.key + "'") << c.block;
      EXPECT_CONTAINS(msg, c.says) << c.block;
    } else {
      auto warnings = warnings_of(doc);
      ASSERT_EQ(warnings.size(), 1u) << c.block;  // said once
      EXPECT_CONTAINS(warnings[0], std::string("'") + c.key + "'") << c.block;
      EXPECT_CONTAINS(warnings[0], c.says) << c.block;
    }
  }
}

TEST(ConfigUnprovidedBlocks, SwitchedOffBlocksAreAcceptedSilently) {
  json doc = with(json::parse(R"({
    "amp": {"enabled": false, "opt_level": "O2"},
    "wandb": {"enabled": false}, "comet": {"enabled": false},
    "nebula": {"enabled": false}, "autotuning": {"enabled": false, "metric": "throughput"},
    "compression_training": {"weight_quantization": {"shared_parameters": {"enabled": false}},
                             "layer_reduction": {"enabled": false}},
    "data_efficiency": {"enabled": false, "data_sampling": {"enabled": true}},
    "progressive_layer_drop": {"enabled": false}, "elasticity": {"enabled": false},
    "weight_quantization": {"enabled": false}})"));
  auto warnings = warnings_of(doc);
  EXPECT_TRUE(warnings.empty()) << warnings.front();
}

// The outer switches of data_efficiency do not turn a technique on (DeepSpeed's engine never
// reads them) and do not keep one off: only the inner ones count, whatever the outer ones say.
TEST(ConfigUnprovidedBlocks, DataEfficiencyIsDecidedByItsInnerSwitches) {
  EXPECT_TRUE(warnings_of(with(json::parse(R"({"data_efficiency": {"enabled": true,
      "data_sampling": {"enabled": true, "curriculum_learning": {"enabled": false}},
      "data_routing": {"enabled": true, "random_ltd": {"enabled": false}}}})")))
                  .empty());
  EXPECT_CONTAINS(error_of(with(json::parse(R"({"data_efficiency": {"enabled": false,
      "data_sampling": {"enabled": false, "curriculum_learning": {"enabled": true}}}})"))),
                  "'data_efficiency.data_sampling.curriculum_learning.enabled' is true");
  EXPECT_CONTAINS(error_of(with(json::parse(R"({"data_efficiency": {"enabled": false,
      "data_routing": {"enabled": false, "random_ltd": {"enabled": "true"}}}})"))),
                  "'data_efficiency.data_routing.random_ltd.enabled' is true");
}

// tensor_parallel.tp.enabled (DeepSpeedTPConfig's switch): accepted; training reads nothing of
// tp, and false turns off the tp_size note.
TEST(ConfigStrictBlocks, TensorParallelTpEnabledIsAccepted) {
  EXPECT_TRUE(warnings_of(with({{"tensor_parallel", {{"tp", {{"enabled", true}}}}}})).empty());
  EXPECT_TRUE(
      warnings_of(with({{"tensor_parallel", {{"tp", {{"enabled", false}, {"tp_size", 2}}}}}}))
          .empty());
  const json tp_on = {{"tensor_parallel", {{"tp", {{"enabled", true}, {"tp_size", 2}}}}}};
  EXPECT_EQ(warnings_of(with(tp_on)).size(), 1u);
  EXPECT_CONTAINS(error_of(with({{"tensor_parallel", {{"tp", {{"enabled", "maybe"}}}}}})),
                  "config key 'tensor_parallel.tp.enabled' has value \"maybe\"");
}

TEST(ConfigUnprovidedBlocks, EnabledAsStringIsReadAsABoolean) {
  EXPECT_CONTAINS(error_of(with({{"amp", {{"enabled", "true"}}}})), "'amp.enabled' is true");
  EXPECT_CONTAINS(error_of(with({{"amp", {{"enabled", "maybe"}}}})),
                  "config key 'amp.enabled' has value \"maybe\"");
}

}  // namespace config_policy_test
}  // namespace deepspeed
