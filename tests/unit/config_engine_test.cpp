// Config values as the engines take them, single process: the fp16 wrapper's reading of
// optimizer.params.torch_adam, activation_checkpointing.number_checkpoints through initialize()
// and configure(), and "auto" filled for initialize_pipeline() from its overrides.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <fstream>

#include "deepspeed/checkpointing.h"
#include "deepspeed/engine.h"
#include "deepspeed/errors.h"
#include "deepspeed/pipe.h"
#include "gpt/pipeline_model.h"
#include "precision/loss_scaler.h"
#include "runtime/engine_state.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/half_mlp.h"
#include "support/pipeline_gpt.h"

namespace config_engine_test {

namespace {

using dstest::HalfMlp;
using dstest::HalfMlpImpl;
using nlohmann::json;

json fp16_stage0(json optimizer) {
  return {{"train_micro_batch_size_per_gpu", 8},
          {"steps_per_print", 0},
          {"fp16", {{"enabled", true}}},
          {"optimizer", std::move(optimizer)}};
}

double min_loss_scale_of(const json& config) {
  auto engine =
      deepspeed::initialize<HalfMlpImpl>({.model = HalfMlp().ptr(), .config_json = config}).engine;
  auto& scaler = dynamic_cast<deepspeed::precision::DynamicLossScaler&>(
      *deepspeed::state_of(*engine).loss_scaler);
  return scaler.min_scale();
}

// Without ZeRO, Adam with params.torch_adam runs under FP16_UnfusedOptimizer (floor 0.25), not
// FP16_Optimizer (floor 1). torch_adam is read as the optimizer reads it, so "true" is true there
// too (before, only a JSON true counted and "true" got the fused wrapper's floor).
TEST(ConfigEngine, TorchAdamAsAStringPicksTheUnfusedWrapper) {
  at::set_num_threads(1);
  for (json on : {json(true), json("true"), json("True"), json(1)}) {
    json adam = {{"type", "Adam"}, {"params", {{"lr", 1e-3}, {"torch_adam", on}}}};
    EXPECT_EQ(min_loss_scale_of(fp16_stage0(adam)), 0.25) << on.dump();
  }
  for (json off : {json(false), json("FALSE"), json(0)}) {
    json adam = {{"type", "Adam"}, {"params", {{"lr", 1e-3}, {"torch_adam", off}}}};
    EXPECT_EQ(min_loss_scale_of(fp16_stage0(adam)), 1.0) << off.dump();
  }
  json bad = {{"type", "Adam"}, {"params", {{"lr", 1e-3}, {"torch_adam", "yes"}}}};
  EXPECT_CONTAINS(
      dstest::message_of<deepspeed::ConfigError>([&] { min_loss_scale_of(fp16_stage0(bad)); }),
      "optimizer.params.torch_adam");
}

// DeepSpeed-Chat's fp16 block (min_loss_scale 0, apex's opt_level) builds an engine whose scaler
// has no floor of its own.
TEST(ConfigEngine, DeepSpeedChatFp16BlockInitializes) {
  at::set_num_threads(1);
  json config = fp16_stage0({{"type", "Adam"}, {"params", {{"lr", 1e-3}}}});
  config["fp16"] = json::parse(
      R"({"enabled": true, "opt_level": "O2", "loss_scale_window": 100, "min_loss_scale": 0})");
  EXPECT_EQ(min_loss_scale_of(config), 0.0);
}

// number_checkpoints only sizes the contiguous buffer (DeepSpeed's default: None): 0 without
// contiguous_memory_optimization builds an engine; with it, configure() refuses a count < 1.
TEST(ConfigEngine, NumberCheckpointsZeroWithoutContiguousMemoryInitializes) {
  at::set_num_threads(1);
  json config = {{"train_micro_batch_size_per_gpu", 8},
                 {"steps_per_print", 0},
                 {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 1e-2}}}}},
                 {"activation_checkpointing", {{"number_checkpoints", 0}}}};
  auto model = torch::nn::Linear(4, 2);
  EXPECT_NO_THROW(
      deepspeed::initialize<torch::nn::LinearImpl>({.model = model.ptr(), .config_json = config}));
  EXPECT_EQ(deepspeed::checkpointing::options().number_checkpoints, 0);

  deepspeed::checkpointing::Options contiguous;
  contiguous.contiguous_memory_optimization = true;
  contiguous.number_checkpoints = 0;
  EXPECT_CONTAINS(dstest::message_of<deepspeed::ConfigError>(
                      [&] { deepspeed::checkpointing::configure(contiguous); }),
                  "activation_checkpointing.number_checkpoints");
  deepspeed::checkpointing::configure({});  // the process-wide options back to the defaults
}

// The pipeline engine fills "auto" from PipelineInitializeArgs.overrides as initialize() does
// from InitializeArgs.overrides.
TEST(ConfigEngine, PipelineFillsAutoFromItsOverrides) {
  at::set_num_threads(1);
  json config = dstest::pipeline_config(1, 0);
  config["train_micro_batch_size_per_gpu"] = "auto";
  config["optimizer"]["params"]["lr"] = "auto";
  deepspeed::pipe::PipelineInitializeArgs args;
  args.model = gpt::gpt_pipeline(dstest::tiny_pipeline_gpt(false));
  args.model.num_stages = 1;
  args.config_json = config;
  args.comm = deepspeed::comm::make_single_process_communicator();
  args.device = "cpu";
  args.overrides.train_micro_batch_size_per_gpu = dstest::kPipeMicro;
  args.overrides.learning_rate = 3e-3;
  auto engine = deepspeed::pipe::initialize_pipeline(args);
  EXPECT_EQ(engine->train_micro_batch_size_per_gpu(), dstest::kPipeMicro);
  EXPECT_DOUBLE_EQ(engine->config().optimizer->params["lr"].get<double>(), 3e-3);
  int m = 0;
  const double loss = engine->train_batch([&] { return dstest::pipeline_micro_batch(0, m++); });
  EXPECT_TRUE(std::isfinite(loss));

  // Without the overrides the error names the key and where its value goes.
  args.overrides = {};
  const std::string msg = dstest::message_of<deepspeed::ConfigError>(
      [&] { deepspeed::pipe::initialize_pipeline(args); });
  EXPECT_CONTAINS(msg, "optimizer.params.lr");
  EXPECT_CONTAINS(msg, "initialize_pipeline()");
}

// A config file is read as load_config reads it (hjson, as DeepSpeed does), and pipeline.stages
// by parse_config's rule: a '#' comment, a trailing comma and "1" for the stage count all load.
TEST(ConfigEngine, PipelineReadsItsConfigFileAsHjson) {
  at::set_num_threads(1);
  dstest::TempDir dir("ds_pipe_hjson");
  json config = dstest::pipeline_config(1, 0);
  for (const json& stages : {json("1"), json(1.0)}) {
    config["pipeline"] = {{"stages", stages}};
    std::string text = config.dump(2);
    // A trailing comma after the last member, then a comment.
    text.insert(text.find_last_not_of(" \n", text.rfind('}') - 1) + 1,
                ",  # DeepSpeed's hjson reader allows these");
    const std::string path = dir / "ds_config.json";
    { std::ofstream(path) << text; }
    deepspeed::pipe::PipelineInitializeArgs args;
    args.model = gpt::gpt_pipeline(dstest::tiny_pipeline_gpt(false));  // num_stages unset
    args.config = path;
    args.comm = deepspeed::comm::make_single_process_communicator();
    args.device = "cpu";
    std::shared_ptr<deepspeed::pipe::PipelineEngine> engine;
    ASSERT_NO_THROW(engine = deepspeed::pipe::initialize_pipeline(args)) << text;
    EXPECT_EQ(engine->num_stages(), 1) << stages.dump();
  }
}

}  // namespace

}  // namespace config_engine_test
