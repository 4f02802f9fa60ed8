// A libtorch error during training reaches the user as deepspeed::Error naming the rank and the
// phase (forward, backward, step) with libtorch's message, never its C++ stack frames; fp16 on a
// CPU operator without a Half kernel is a ConfigError naming fp16.enabled and suggesting bf16.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>

#include "deepspeed/checkpointing.h"
#include "deepspeed/deepspeed.h"
#include "gpt/model.h"
#include "support/cpu_half.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/training_run.h"

namespace engine_errors_test {

namespace {
using nlohmann::json;

// Markers of a libtorch backtrace (c10::Error::what() appends one).
void expect_no_stack_frames(const std::string& msg) {
  EXPECT_EQ(msg.find("frame #"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("Exception raised from"), std::string::npos) << msg;
}

// forward(x, y): x @ w with a deliberately wrong shape when `bad_shape`.
struct ShapeNetImpl : torch::nn::Module {
  torch::Tensor w;
  ShapeNetImpl() { w = register_parameter("w", torch::randn({4, 3})); }
  torch::Tensor forward(torch::Tensor x, torch::Tensor y) {
    return (torch::matmul(x, w) - y).pow(2).mean();
  }
};

// An optimizer whose step fails inside libtorch.
struct FailingSgd : torch::optim::SGD {
  using torch::optim::SGD::SGD;
  torch::Tensor step(LossClosure) override {
    TORCH_CHECK(false, "simulated optimizer failure");
    return {};
  }
};

json tiny_config() {
  return {{"train_micro_batch_size_per_gpu", 2},
          {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}}}}}};
}
}  // namespace

// libtorch 1.13 has no CPU Half kernel for some GPT ops: refused naming the key and bf16.
// libtorch 2.x has them: fp16 trains on the CPU (support/cpu_half.h tells which this is).
TEST(EngineErrors, Fp16OnTheCpuTrainsOrIsRefusedNamingTheKeyAndBf16) {
  auto model = std::make_shared<gpt::GPTImpl>(gpt::GPTConfig{256, 16, 1, 2, 16});
  auto config = dstest::base_config(2, 1, 0);
  config["fp16"] = {{"enabled", true}};
  auto r = deepspeed::initialize<gpt::GPTImpl>({.model = model, .config_json = config});
  auto x = torch::randint(0, 256, {2, 16}, torch::kLong);
  if (dstest::cpu_runs_the_gpt_in_fp16()) {
    for (int step = 0; step < 2; ++step) {
      auto loss = r.engine->forward(x, x);
      EXPECT_TRUE(std::isfinite(loss.item<double>())) << "step " << step;
      r.engine->backward(loss);
      r.engine->step();
    }
    EXPECT_EQ(r.engine->global_steps(), 2);
    return;
  }
  try {
    r.engine->forward(x, x);
    FAIL() << "expected the fp16 forward to be refused";
  } catch (const deepspeed::ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_CONTAINS(msg, "fp16.enabled");
    EXPECT_CONTAINS(msg, "\"bf16\": {\"enabled\": true}");
    EXPECT_CONTAINS(msg, "rank 0, forward");
    EXPECT_CONTAINS(msg, "not implemented for 'Half'");
    expect_no_stack_frames(msg);
  }
}

TEST(EngineErrors, ForwardErrorNamesRankAndPhase) {
  auto model = std::make_shared<ShapeNetImpl>();
  auto r = deepspeed::initialize<ShapeNetImpl>({.model = model, .config_json = tiny_config()});
  try {
    r.engine->forward(torch::randn({2, 5}), torch::randn({2, 3}));
    FAIL() << "expected an error";
  } catch (const deepspeed::ConfigError& e) {
    FAIL() << "not a config problem: " << e.what();
  } catch (const deepspeed::Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("rank 0, forward: ", 0), 0u) << msg;
    EXPECT_CONTAINS(msg, "cannot be multiplied");
    expect_no_stack_frames(msg);
  }
}

TEST(EngineErrors, BackwardErrorNamesRankAndPhase) {
  auto model = std::make_shared<ShapeNetImpl>();
  auto r = deepspeed::initialize<ShapeNetImpl>({.model = model, .config_json = tiny_config()});
  try {
    r.engine->backward(torch::ones({3}, torch::requires_grad()));
    FAIL() << "expected an error";
  } catch (const deepspeed::Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("rank 0, backward: ", 0), 0u) << msg;
    EXPECT_CONTAINS(msg, "loss must be a scalar");
    expect_no_stack_frames(msg);
  }
}

TEST(EngineErrors, StepErrorNamesRankAndPhase) {
  auto model = std::make_shared<ShapeNetImpl>();
  auto opt = std::make_shared<FailingSgd>(model->parameters(), torch::optim::SGDOptions(0.1));
  auto r = deepspeed::initialize<ShapeNetImpl>(
      {.model = model, .config_json = tiny_config(), .optimizer = opt});
  auto loss = r.engine->forward(torch::randn({2, 4}), torch::randn({2, 3}));
  r.engine->backward(loss);
  try {
    r.engine->step();
    FAIL() << "expected an error";
  } catch (const deepspeed::Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("rank 0, step: ", 0), 0u) << msg;
    EXPECT_CONTAINS(msg, "simulated optimizer failure");
    expect_no_stack_frames(msg);
  }
}

namespace {
// One Linear applied in two activation-checkpointed segments: each recomputation runs a backward
// of its own, so the Linear's gradient arrives twice in one engine backward.
struct SharedTwiceImpl : torch::nn::Module {
  torch::nn::Linear lin{nullptr};
  SharedTwiceImpl() { lin = register_module("lin", torch::nn::Linear(4, 4)); }
  torch::Tensor forward(torch::Tensor x, torch::Tensor y) {
    auto segment = [this](const torch::Tensor& t) { return torch::tanh(lin->forward(t)); };
    auto h = deepspeed::checkpointing::checkpoint(segment, x);
    h = deepspeed::checkpointing::checkpoint(segment, h);
    return (h - y).pow(2).mean();
  }
};
}  // namespace

// At stage 2 every gradient goes into its bucket as it arrives: the second arrival overwrote
// the first (a silently lost gradient). DeepSpeed refuses it; so does this, naming the cause.
TEST(EngineErrors, AParameterSharedByTwoCheckpointedSegmentsIsRefusedAtStageTwo) {
  json config = tiny_config();
  config["zero_optimization"] = {{"stage", 2}};
  config["optimizer"] = {{"type", "AdamW"}, {"params", {{"lr", 0.1}}}};
  auto model = std::make_shared<SharedTwiceImpl>();
  auto r = deepspeed::initialize<SharedTwiceImpl>({.model = model, .config_json = config});
  auto x = torch::randn({2, 4}, torch::requires_grad()), y = torch::randn({2, 4});
  const std::string msg = dstest::message_of<deepspeed::Error>(
      [&] { r.engine->backward(r.engine->forward(x, y)); });
  EXPECT_CONTAINS(msg, "twice in one backward");
  EXPECT_CONTAINS(msg, "checkpointed");
}

// Stage 3 too: its hook used to return early once the bucket had gone out, leaving the second
// gradient on the parameter at full size (added into the next step), or, when the bucket had not
// gone out, overwrote the first and counted the parameter twice toward its bucket and unit. The
// refusal leaves no gradient behind, and the engine recovers as at stage 2: the refused backward
// is abandoned and the one after it is refused the same way, not stuck on what the first left.
TEST(EngineErrors, AParameterSharedByTwoCheckpointedSegmentsIsRefusedAtStageThree) {
  json config = tiny_config();
  config["zero_optimization"] = {{"stage", 3}};
  config["optimizer"] = {{"type", "AdamW"}, {"params", {{"lr", 0.1}}}};
  auto model = std::make_shared<SharedTwiceImpl>();
  auto r = deepspeed::initialize<SharedTwiceImpl>({.model = model, .config_json = config});
  auto x = torch::randn({2, 4}, torch::requires_grad()), y = torch::randn({2, 4});
  for (int attempt = 0; attempt < 2; ++attempt) {
    const std::string msg = dstest::message_of<deepspeed::Error>(
        [&] { r.engine->backward(r.engine->forward(x, y)); });
    EXPECT_CONTAINS(msg, "twice in one backward");
    EXPECT_CONTAINS(msg, "keep a shared parameter inside one checkpointed segment");
    // overlap_comm is the stages 0/1 remedy, not stage 3's
    EXPECT_EQ(msg.find("overlap_comm"), std::string::npos) << msg;
    for (auto& p : model->parameters())
      EXPECT_FALSE(p.grad().defined()) << "a refused gradient stayed on the parameter, attempt "
                                       << attempt;
  }
}


namespace {
// The config of an engine built for evaluation: no "optimizer" block (a "scheduler" block is
// ignored without one, as DeepSpeed configures no scheduler then).
json eval_config(int stage, bool bf16) {
  json config = dstest::base_config(2, 1, stage);
  config.erase("optimizer");
  config["scheduler"] = {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 10}}}};
  if (bf16) config["bf16"] = {{"enabled", true}};
  return config;
}

std::shared_ptr<gpt::GPTImpl> seeded_gpt(uint64_t seed) {
  torch::manual_seed(seed);
  return std::make_shared<gpt::GPTImpl>(gpt::GPTConfig{256, 16, 2, 2, 32});
}

// As initialize() casts a bf16 model: floating-point parameters and buffers only.
void to_bf16(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters())
    if (p.is_floating_point()) p.set_data(p.to(torch::kBFloat16));
  for (auto& b : model.buffers())
    if (b.is_floating_point()) b.set_data(b.to(torch::kBFloat16));
}

double loss_of(torch::nn::Module& model, const torch::Tensor& x, const torch::Tensor& y) {
  torch::NoGradGuard no_grad;
  return dynamic_cast<gpt::GPTImpl&>(model).forward(x, y).item<double>();
}
}  // namespace

// DeepSpeed accepts a model without an optimizer (an evaluation or reference engine: DeepSpeed-
// Chat's ZeRO-3 reference model): initialize() returns no optimizer, forward works at every
// stage (stage 3 gathers its partitioned units), no optimizer state or gradient storage is
// allocated, and backward()/step() are refused in DeepSpeed's words. (It was a ConfigError at
// initialize().)
TEST(EngineErrors, WithoutAnOptimizerEvaluatesAtEveryStageAndRefusesTraining) {
  const auto x = torch::randint(0, 256, {2, 16}, torch::kLong);
  const auto y = torch::randint(0, 256, {2, 16}, torch::kLong);
  for (int stage = 0; stage <= 3; ++stage)
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + (bf16 ? ", bf16" : ", fp32"));
      auto reference = seeded_gpt(5);
      if (bf16) to_bf16(*reference);
      auto model = seeded_gpt(5);
      auto r = deepspeed::initialize<gpt::GPTImpl>(
          {.model = model, .config_json = eval_config(stage, bf16)});
      EXPECT_EQ(r.optimizer, nullptr);
      EXPECT_EQ(r.lr_scheduler, nullptr);
      EXPECT_TRUE(r.engine->get_lr().empty());
      const auto memory = r.engine->memory_report();
      EXPECT_EQ(memory.optimizer_states, 0);
      EXPECT_EQ(memory.gradients, 0);
      double loss = 0.0;
      {
        torch::NoGradGuard no_grad;
        loss = r.engine->forward(x, y).item<double>();
      }
      EXPECT_NEAR(loss, loss_of(*reference, x, y), 1e-6 * std::abs(loss));

      const std::string backward = dstest::message_of<deepspeed::Error>(
          [&] { r.engine->backward(r.engine->forward(x, y)); });
      EXPECT_CONTAINS(backward, "must provide optimizer during init in order to use backward");
      EXPECT_CONTAINS(backward, "\"optimizer\" block");
      const std::string step = dstest::message_of<deepspeed::Error>([&] { r.engine->step(); });
      EXPECT_CONTAINS(step, "must provide optimizer during init in order to use step");
      for (auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined());
      EXPECT_EQ(r.engine->global_steps(), 0);
      // Still evaluates after the refusals.
      torch::NoGradGuard no_grad;
      EXPECT_NEAR(r.engine->forward(x, y).item<double>(), loss, 1e-6 * std::abs(loss));
    }
}

// The weights of an engine without an optimizer go through save_checkpoint / load_checkpoint
// (and save_16bit_model): a second engine, initialised with other weights, evaluates like the
// first after the load.
TEST(EngineErrors, WithoutAnOptimizerCheckpointsTheWeights) {
  const auto x = torch::randint(0, 256, {2, 16}, torch::kLong);
  const auto y = torch::randint(0, 256, {2, 16}, torch::kLong);
  for (int stage : {0, 1, 3})
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + (bf16 ? ", bf16" : ", fp32"));
      dstest::TempDir dir("ds_no_optimizer");
      json config = eval_config(stage, bf16);
      config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = true;
      auto saved =
          deepspeed::initialize<gpt::GPTImpl>({.model = seeded_gpt(5), .config_json = config});
      ASSERT_TRUE(saved.engine->save_checkpoint(dir.path(), "eval"));
      ASSERT_TRUE(saved.engine->save_16bit_model(dir.path()));
      EXPECT_TRUE(std::filesystem::exists(dir / "pytorch_model.bin"));
      torch::NoGradGuard no_grad;
      const double want = saved.engine->forward(x, y).item<double>();
      auto loaded =
          deepspeed::initialize<gpt::GPTImpl>({.model = seeded_gpt(6), .config_json = config});
      ASSERT_NE(loaded.engine->forward(x, y).item<double>(), want);
      const auto result = loaded.engine->load_checkpoint(dir.path(), "eval");
      EXPECT_FALSE(result.load_path.empty());
      EXPECT_NEAR(loaded.engine->forward(x, y).item<double>(), want, 1e-6 * std::abs(want));
    }
}

}  // namespace engine_errors_test
