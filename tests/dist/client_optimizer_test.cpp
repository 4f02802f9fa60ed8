// A client optimizer (InitializeArgs.optimizer, no "optimizer" block) at ZeRO stages 1-3, with
// 16-bit training and under optimizer offload, against the same optimizer built from the config.
// Adam: the client torch::optim::Adam steps the fp32 partition with libtorch's arithmetic, the
// config's Adam with the fused kernel; the two differ by float rounding only, so the losses agree
// to 1e-6 over 8 steps. SGD is libtorch's SGD both ways. Under offload the client Adam becomes the
// CPU Adam with its options: then the runs are the same arithmetic and agree exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "deepspeed/errors.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/param_groups.h"
#include "support/training_run.h"

namespace client_optimizer_test {

namespace {
using nlohmann::json;
using ClientFactory = std::function<std::shared_ptr<torch::optim::Optimizer>(gpt::GPTImpl&)>;

constexpr double kAdamLossTol = 1e-6;
constexpr int kSteps = 8;

dstest::RunResult run(int world, int stage, const json& optimizer_block, ClientFactory client,
                      const json& extra = json()) {
  dstest::RunSpec s;
  s.world_size = world;
  s.steps = kSteps;
  s.config = dstest::base_config(2, 1, stage);
  if (stage == 3) s.config["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
  if (optimizer_block.is_null())
    s.config.erase("optimizer");
  else
    s.config["optimizer"] = optimizer_block;
  if (!extra.is_null()) s.config.merge_patch(extra);
  s.client_optimizer = std::move(client);
  return dstest::train_gpt(s);
}

// A NaN difference makes the result +infinity (std::max(m, NaN) is m: a NaN run would pass).
double max_loss_abs_diff(const dstest::RunResult& a, const dstest::RunResult& b) {
  EXPECT_EQ(a.losses.size(), b.losses.size());
  double m = 0.0;
  for (size_t i = 0; i < std::min(a.losses.size(), b.losses.size()); ++i) {
    const double d = std::abs(a.losses[i] - b.losses[i]);
    if (!(d <= m)) m = std::isnan(d) ? std::numeric_limits<double>::infinity() : d;
  }
  return m;
}

// torch::optim::Adam (L2 weight decay) = DeepSpeed "Adam" with adam_w_mode false.
const json kConfigAdam = {
    {"type", "Adam"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.01}, {"adam_w_mode", false}}}};
ClientFactory client_adam() {
  return [](gpt::GPTImpl& m) {
    return std::make_shared<torch::optim::Adam>(m.parameters(),
                                                torch::optim::AdamOptions(3e-3).weight_decay(0.01));
  };
}
const json kConfigAdamW = {{"type", "AdamW"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.01}}}};
ClientFactory client_adamw() {
  return [](gpt::GPTImpl& m) {
    return std::make_shared<torch::optim::AdamW>(
        m.parameters(), torch::optim::AdamWOptions(3e-3).weight_decay(0.01));
  };
}
const json kConfigSgd = {{"type", "SGD"}, {"params", {{"lr", 0.05}, {"momentum", 0.9}}}};
ClientFactory client_sgd() {
  return [](gpt::GPTImpl& m) {
    return std::make_shared<torch::optim::SGD>(m.parameters(),
                                               torch::optim::SGDOptions(0.05).momentum(0.9));
  };
}
// libtorch's Adagrad makes each parameter's state (its sum, from initial_accumulator_value) in
// its constructor only; under ZeRO its parameters become the partition.
ClientFactory client_adagrad() {
  return [](gpt::GPTImpl& m) {
    return std::make_shared<torch::optim::Adagrad>(
        m.parameters(),
        torch::optim::AdagradOptions(0.01).lr_decay(0.05).initial_accumulator_value(0.5));
  };
}

std::string config_error_of(const std::function<void()>& f) {
  return dstest::message_of<deepspeed::ConfigError>(f);
}
}  // namespace

class ClientOptimizerStages : public ::testing::TestWithParam<int> {};

TEST_P(ClientOptimizerStages, AdamMatchesTheConfigAdam) {
  const int stage = GetParam();
  auto configured = run(2, stage, kConfigAdam, nullptr);
  auto client = run(2, stage, json(), client_adam());
  ASSERT_EQ(client.losses.size(), size_t(kSteps));
  EXPECT_LT(max_loss_abs_diff(client, configured), kAdamLossTol);
  EXPECT_LT(dstest::max_grad_norm_rel_diff(client, configured), dstest::kGradNormTol);
  EXPECT_LT(client.losses.back(), client.losses.front());  // it trains
}

TEST_P(ClientOptimizerStages, SgdMatchesTheConfigSgd) {
  const int stage = GetParam();
  auto configured = run(2, stage, kConfigSgd, nullptr);
  auto client = run(2, stage, json(), client_sgd());
  EXPECT_LT(max_loss_abs_diff(client, configured), kAdamLossTol);
  EXPECT_LT(dstest::max_weight_diff(client, configured), 1e-6);
  EXPECT_LT(dstest::max_grad_norm_rel_diff(client, configured), dstest::kGradNormTol);
}

INSTANTIATE_TEST_SUITE_P(Stages, ClientOptimizerStages, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return "stage" + std::to_string(info.param); });

// With bf16 the client optimizer steps the fp32 masters; the 16-bit copies are rounded from them,
// where a 1-ulp difference between the two Adam implementations can flip a bf16 rounding, so
// losses agree to bf16 precision (2^-8 relative), not 1e-6.
TEST(ClientOptimizer, AdamWWithBf16StepsTheMasters) {
  for (int stage : {0, 2, 3}) {
    json bf16 = {{"bf16", {{"enabled", true}}}};
    auto configured = run(2, stage, kConfigAdamW, nullptr, bf16);
    auto client = run(2, stage, json(), client_adamw(), bf16);
    EXPECT_LT(dstest::max_loss_rel_diff(client, configured), 4e-3) << "stage " << stage;
    EXPECT_LT(dstest::max_grad_norm_rel_diff(client, configured), dstest::kBf16GradNormTol)
        << "stage " << stage;
  }
}

// zero_force_ds_cpu_optimizer: under optimizer offload the client Adam/AdamW runs as the CPU Adam
// with its own options, i.e. exactly what the config's Adam block builds.
TEST(ClientOptimizer, AdamUnderCpuOffloadIsTheCpuAdam) {
  json offload = {{"zero_optimization", {{"offload_optimizer", {{"device", "cpu"}}}}}};
  auto configured = run(2, 2, kConfigAdam, nullptr, offload);
  auto client = run(2, 2, json(), client_adam(), offload);
  EXPECT_EQ(max_loss_abs_diff(client, configured), 0.0);
  EXPECT_EQ(dstest::max_weight_diff(client, configured), 0.0);
  EXPECT_EQ(dstest::max_grad_norm_rel_diff(client, configured), 0.0);
}

TEST(ClientOptimizer, AdamUnderNvmeOffloadIsTheSwappedAdam) {
  for (int stage : {1, 3}) {
    dstest::TempDir a, b;
    auto nvme = [](const dstest::TempDir& d) {
      return json{{"zero_optimization",
                   {{"offload_optimizer", {{"device", "nvme"}, {"nvme_path", d.path()}}}}}};
    };
    auto configured = run(2, stage, kConfigAdamW, nullptr, nvme(a));
    auto client = run(2, stage, json(), client_adamw(), nvme(b));
    ASSERT_EQ(client.losses.size(), size_t(kSteps));
    EXPECT_EQ(max_loss_abs_diff(client, configured), 0.0) << "stage " << stage;
    EXPECT_EQ(dstest::max_weight_diff(client, configured), 0.0) << "stage " << stage;
    EXPECT_EQ(dstest::max_grad_norm_rel_diff(client, configured), 0.0) << "stage " << stage;
  }
}

// A client Adagrad steps the partition with the state its constructor made for the module's
// parameters (made again at its first step there: libtorch's Adagrad makes state only in its
// constructor), as stage 0 in fp32 steps the module's parameters.
TEST(ClientOptimizer, AdagradStepsThePartitionAsStageZero) {
  auto reference = run(2, 0, json(), client_adagrad());
  for (int stage : {1, 2, 3}) {
    auto zero = run(2, stage, json(), client_adagrad());
    ASSERT_EQ(zero.losses.size(), size_t(kSteps)) << "stage " << stage;
    EXPECT_LT(max_loss_abs_diff(zero, reference), kAdamLossTol) << "stage " << stage;
    EXPECT_LT(dstest::max_weight_diff(zero, reference), 1e-6) << "stage " << stage;
    EXPECT_LT(dstest::max_grad_norm_rel_diff(zero, reference), dstest::kGradNormTol) << "stage " << stage;
  }
  // The accumulator's start matters (so a state made from another value would show).
  auto other_start = [](gpt::GPTImpl& m) {
    return std::make_shared<torch::optim::Adagrad>(
        m.parameters(), torch::optim::AdagradOptions(0.01).lr_decay(0.05));
  };
  EXPECT_GT(dstest::max_weight_diff(run(2, 0, json(), other_start), reference), 1e-5);
}

TEST(ClientOptimizer, OtherTypesUnderOffloadAreRefusedNamingTheKey) {
  json offload = {{"zero_optimization", {{"offload_optimizer", {{"device", "cpu"}}}}}};
  std::string msg = config_error_of([&] { run(1, 2, json(), client_sgd(), offload); });
  EXPECT_CONTAINS(msg, "zero_force_ds_cpu_optimizer");
  EXPECT_CONTAINS(msg, "offload_optimizer.device");
}

TEST(ClientOptimizer, OtherTypesUnderCpuOffloadRunWhenNotForced) {
  json offload = {{"zero_force_ds_cpu_optimizer", false},
                  {"zero_optimization", {{"offload_optimizer", {{"device", "cpu"}}}}}};
  auto configured = run(2, 2, kConfigSgd, nullptr, offload);
  auto client = run(2, 2, json(), client_sgd(), offload);
  EXPECT_LT(max_loss_abs_diff(client, configured), kAdamLossTol);
}

TEST(ClientOptimizer, TheClientObjectIsTheEngineOptimizer) {
  auto model = std::make_shared<gpt::GPTImpl>(gpt::GPTConfig{256, 16, 1, 2, 16});
  auto opt =
      std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1));
  auto config = dstest::base_config(2, 1, 2);
  config.erase("optimizer");
  auto r = deepspeed::initialize<gpt::GPTImpl>(
      {.model = model, .config_json = config, .optimizer = opt});
  EXPECT_EQ(r.optimizer.get(), opt.get());
  ASSERT_EQ(opt->param_groups().size(), 1u);
  ASSERT_EQ(opt->param_groups()[0].params().size(), 1u);  // the flat partition
  EXPECT_DOUBLE_EQ(opt->param_groups()[0].options().get_lr(), 0.1);
}

// (Several parameter groups are taken: tests/dist/param_groups_test.cpp.)
TEST(ClientOptimizer, MissingParametersAreRefused) {
  auto model = std::make_shared<gpt::GPTImpl>(gpt::GPTConfig{256, 16, 1, 2, 16});
  auto params = model->parameters();
  auto config = dstest::base_config(2, 1, 1);
  auto some = std::make_shared<torch::optim::SGD>(
      std::vector<torch::Tensor>(params.begin(), params.begin() + 2),
      torch::optim::SGDOptions(0.1));
  std::string msg = config_error_of([&] {
    deepspeed::initialize<gpt::GPTImpl>({.model = model, .config_json = config, .optimizer = some});
  });
  EXPECT_CONTAINS(msg, "holds 2 of the");
}

// ---- Adagrad checkpoints under ZeRO ----
// Adagrad's sums and step count are saved per element ("adagrad_fragments", docs/checkpoints.md),
// with its groups' options. A job resumed at the same world size and stage continues bit for
// bit; at another world size or stage each rank assembles its partition's sums from the saved
// fragments.
namespace {
constexpr int kAdagradSaveAt = 4;

// `stage` (2 by default) on `world` ranks with the global batch of 2 ranks' (4 samples a step),
// the config's Adagrad or a client's, whose options differ between the saving and the resuming
// job (`resumed`): the checkpoint's options and state must win. `two_groups`: the matrices in a
// group of their own with weight decay (the groups step views of each rank's partition).
dstest::RunSpec adagrad_spec(int world, bool client, bool resumed, int stage = 2,
                             bool two_groups = false) {
  dstest::RunSpec s;
  s.world_size = world;
  s.steps = kSteps;
  s.config = dstest::base_config(4 / world, 1, stage);
  if (stage == 3) s.config["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
  s.config["gradient_clipping"] = 0.5;
  const double lr = resumed ? 0.03 : 0.01, decay = resumed ? 0.2 : 0.05,
               start = resumed ? 0.1 : 0.5;
  const double matrix_decay = resumed ? 0.0 : 0.01;
  if (client) {
    s.config.erase("optimizer");
    s.client_optimizer = [=](gpt::GPTImpl& m) {
      const auto options =
          torch::optim::AdagradOptions(lr).lr_decay(decay).initial_accumulator_value(start);
      if (!two_groups) return std::make_shared<torch::optim::Adagrad>(m.parameters(), options);
      auto [matrices, vectors] = dstest::matrices_and_vectors(m);
      auto decayed = std::make_unique<torch::optim::AdagradOptions>(options);
      decayed->weight_decay(matrix_decay);
      return std::make_shared<torch::optim::Adagrad>(
          std::vector<torch::optim::OptimizerParamGroup>{
              torch::optim::OptimizerParamGroup(vectors),
              torch::optim::OptimizerParamGroup(matrices, std::move(decayed))},
          options);
    };
  } else {
    s.config["optimizer"] = {
        {"type", "Adagrad"},
        {"params", {{"lr", lr}, {"lr_decay", decay}, {"initial_accumulator_value", start}}}};
    if (two_groups)
      s.model_parameters = [=](gpt::GPTImpl& m) {
        auto [matrices, vectors] = dstest::matrices_and_vectors(m);
        return std::vector<deepspeed::ParamGroup>{
            {vectors, json::object()}, {matrices, {{"weight_decay", matrix_decay}}}};
      };
  }
  return s;
}

// `saving` trains to `save_at` and saves; `resuming` loads that checkpoint (with or
// without the optimizer states) and trains on.
dstest::RunResult save_and_resume(dstest::RunSpec saving, dstest::RunSpec resuming,
                                  bool load_optimizer_states = true,
                                  int save_at = kAdagradSaveAt) {
  dstest::TempDir dir;
  saving.steps = save_at;
  saving.after_training = [&](deepspeed::Engine& e) { e.save_checkpoint(dir.path()); };
  dstest::train_gpt(saving);
  resuming.model_seed = 11;  // other initial weights: the load must replace them
  resuming.before_training = [&](deepspeed::Engine& e) {
    e.load_checkpoint(dir.path(), "", true, load_optimizer_states);
  };
  return dstest::train_gpt(resuming);
}
}  // namespace

TEST(AdagradCheckpoint, ResumesBitForBitAtStage2) {
  for (bool client : {true, false}) {
    SCOPED_TRACE(client ? "client torch::optim::Adagrad" : "config \"Adagrad\"");
    const auto uninterrupted = dstest::train_gpt(adagrad_spec(2, client, false));
    const auto resumed =
        save_and_resume(adagrad_spec(2, client, false), adagrad_spec(2, client, true));
    const std::vector<double> tail(uninterrupted.losses.begin() + kAdagradSaveAt,
                                   uninterrupted.losses.end());
    ASSERT_EQ(tail.size(), size_t(kSteps - kAdagradSaveAt));
    EXPECT_EQ(resumed.losses, tail);  // bit for bit
    EXPECT_EQ(dstest::max_weight_diff(resumed, uninterrupted), 0.0);
    // The resumed job's own options and fresh sums would train otherwise: the match above is
    // the checkpoint's doing.
    const auto weights_only = save_and_resume(adagrad_spec(2, client, false),
                                              adagrad_spec(2, client, true), false);
    EXPECT_NE(weights_only.losses, tail);
  }
}

// Saved on 2 ranks at stage 2, loaded on 1 or 4 ranks at stages 0-3, with one parameter group or
// two: each rank assembles its partition's sums from the saved fragments, and training goes on as
// the uninterrupted run (only summation orders differ). Without the optimizer states it would
// train otherwise (fresh sums, the resuming job's options).
TEST(AdagradCheckpoint, ResumesAtAnotherWorldSizeAndStage) {
  for (bool client : {true, false}) {
    for (bool two_groups : {false, true}) {
      SCOPED_TRACE(std::string(client ? "client" : "config") + " Adagrad" +
                   (two_groups ? ", two groups" : ""));
      const auto saving = adagrad_spec(2, client, false, 2, two_groups);
      const auto uninterrupted = dstest::train_gpt(saving);
      const std::vector<double> tail(uninterrupted.losses.begin() + kAdagradSaveAt,
                                     uninterrupted.losses.end());
      for (auto [world, stage] : {std::pair{1, 0}, std::pair{4, 3}, std::pair{4, 1},
                                  std::pair{1, 2}}) {
        SCOPED_TRACE("resumed at world size " + std::to_string(world) + ", stage " +
                     std::to_string(stage));
        const auto resumed =
            save_and_resume(saving, adagrad_spec(world, client, true, stage, two_groups));
        ASSERT_EQ(resumed.losses.size(), tail.size());
        for (size_t i = 0; i < tail.size(); ++i)
          EXPECT_NEAR(resumed.losses[i], tail[i], 1e-5 * tail[i]) << "step " << i;
      }
      const auto weights_only =
          save_and_resume(saving, adagrad_spec(4, client, true, 1, two_groups), false);
      double apart = 0;
      for (size_t i = 0; i < tail.size(); ++i)
        apart = std::max(apart, std::abs(weights_only.losses[i] - tail[i]) / tail[i]);
      EXPECT_GT(apart, 1e-3);
    }
  }
}

// Saved before the first step. At stage 2 a client Adagrad's sums are not made yet (the stage
// cleared those its constructor made: they were for the module's parameters), so the save makes
// them as the step would (initial_accumulator_value) and the resumed job steps as the
// uninterrupted one, bit for bit. Zeros saved instead would make its first step lr·g/|g|.
TEST(AdagradCheckpoint, SavedBeforeTheFirstStepResumesBitForBit) {
  for (bool client : {true, false}) {
    for (int stage : {0, 2}) {
      for (bool two_groups : {false, true}) {
        SCOPED_TRACE(std::string(client ? "client" : "config") + " Adagrad, stage " +
                     std::to_string(stage) + (two_groups ? ", two groups" : ""));
        const auto saving = adagrad_spec(2, client, false, stage, two_groups);
        const auto uninterrupted = dstest::train_gpt(saving);
        const auto resumed = save_and_resume(
            saving, adagrad_spec(2, client, true, stage, two_groups), true, /*save_at=*/0);
        EXPECT_EQ(resumed.losses, uninterrupted.losses);
        EXPECT_EQ(dstest::max_weight_diff(resumed, uninterrupted), 0.0);
      }
    }
  }
}

// At stage 0 in fp32 a client optimizer may hold only some of the trainable parameters (here
// the matrices; the vectors keep their initial values): the others get no state to save or
// load, and the job resumes bit for bit.
TEST(AdagradCheckpoint, StageZeroClientHoldingSomeParametersResumes) {
  auto spec = [](bool resumed) {
    auto s = adagrad_spec(2, true, resumed, 0);
    s.client_optimizer = [resumed](gpt::GPTImpl& m) {
      return std::make_shared<torch::optim::Adagrad>(
          dstest::matrices_and_vectors(m).matrices,
          torch::optim::AdagradOptions(resumed ? 0.03 : 0.01).initial_accumulator_value(0.5));
    };
    return s;
  };
  const auto uninterrupted = dstest::train_gpt(spec(false));
  const std::vector<double> tail(uninterrupted.losses.begin() + kAdagradSaveAt,
                                 uninterrupted.losses.end());
  const auto resumed = save_and_resume(spec(false), spec(true));
  EXPECT_EQ(resumed.losses, tail);
  EXPECT_EQ(dstest::max_weight_diff(resumed, uninterrupted), 0.0);
}

}  // namespace client_optimizer_test
