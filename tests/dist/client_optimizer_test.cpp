// A client optimizer (InitializeArgs.optimizer, no "optimizer" block) at ZeRO stages 1-3, with
// 16-bit training and under optimizer offload, against the same optimizer built from the config.
// Adam: the client torch::optim::Adam steps the fp32 partition with libtorch's arithmetic, the
// config's Adam with the fused kernel; the two differ by float rounding only, so the losses agree
// to 1e-6 over 8 steps. SGD is libtorch's SGD both ways. Under offload the client Adam becomes the
// CPU Adam with its options: then the runs are the same arithmetic and agree exactly. At the
// end: Adagrad's and SGD's checkpoints (their state saved per element), client and config.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <set>

#include "deepspeed/errors.h"
#include "support/checkpoint_run.h"
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

// kSteps at `stage` on `world` ranks with the global batch of 2 ranks' (4 samples a step),
// clipped; stage 3 partitions every parameter. The optimizer is the caller's.
dstest::RunSpec resume_run(int world, int stage) {
  dstest::RunSpec s;
  s.world_size = world;
  s.steps = kSteps;
  s.config = dstest::base_config(4 / world, 1, stage);
  if (stage == 3) s.config["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
  s.config["gradient_clipping"] = 0.5;
  return s;
}

// `stage` (2 by default) on `world` ranks with the global batch of 2 ranks' (4 samples a step),
// the config's Adagrad or a client's, whose options differ between the saving and the resuming
// job (`resumed`): the checkpoint's options and state must win. `two_groups`: the matrices in a
// group of their own with weight decay (the groups step views of each rank's partition).
dstest::RunSpec adagrad_spec(int world, bool client, bool resumed, int stage = 2,
                             bool two_groups = false) {
  dstest::RunSpec s = resume_run(world, stage);
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

// adagrad_spec's or sgd_spec's signature: (world, client, resumed, stage, two_groups).
using SpecFor = std::function<dstest::RunSpec(int, bool, bool, int, bool)>;

// Saved by `saving` (world 2, stage 2) after `save_at` steps and loaded on 1 or 4 ranks at
// stages 0-3 by a job built with the resuming options (spec(..., resumed = true, ...)): training
// goes on as `tail` (the uninterrupted run's steps after save_at; only summation orders differ).
// Loaded without the optimizer states (the saved options, the weights loaded) it must train at
// least `control_apart` (relative loss) away from `tail`.
void expect_reshards(const SpecFor& spec, const dstest::RunSpec& saving, bool client,
                     bool two_groups, const std::vector<double>& tail, int save_at,
                     double control_apart) {
  for (auto [world, stage] : {std::pair{1, 0}, std::pair{4, 3}, std::pair{4, 1}, std::pair{1, 2}}) {
    SCOPED_TRACE("resumed at world size " + std::to_string(world) + ", stage " +
                 std::to_string(stage));
    const auto resumed =
        save_and_resume(saving, spec(world, client, true, stage, two_groups), true, save_at);
    ASSERT_EQ(resumed.losses.size(), tail.size());
    for (size_t i = 0; i < tail.size(); ++i)
      EXPECT_NEAR(resumed.losses[i], tail[i], 1e-5 * tail[i]) << "step " << i;
  }
  const auto weights_only =
      save_and_resume(saving, spec(4, client, false, 1, two_groups), false, save_at);
  double apart = 0;
  for (size_t i = 0; i < tail.size(); ++i)
    apart = std::max(apart, std::abs(weights_only.losses[i] - tail[i]) / tail[i]);
  EXPECT_GT(apart, control_apart);
}

// Saved before the first step at stages 0 and 2 (client and config, one group or two) and
// resumed at the same layout by a job built with the resuming options: bit for bit.
void expect_step_zero_resumes_bit_for_bit(const SpecFor& spec, const std::string& what) {
  for (bool client : {true, false}) {
    for (int stage : {0, 2}) {
      for (bool two_groups : {false, true}) {
        SCOPED_TRACE(std::string(client ? "client " : "config ") + what + ", stage " +
                     std::to_string(stage) + (two_groups ? ", two groups" : ""));
        const auto saving = spec(2, client, false, stage, two_groups);
        const auto uninterrupted = dstest::train_gpt(saving);
        const auto resumed =
            save_and_resume(saving, spec(2, client, true, stage, two_groups), true, /*save_at=*/0);
        EXPECT_EQ(resumed.losses, uninterrupted.losses);
        EXPECT_EQ(dstest::max_weight_diff(resumed, uninterrupted), 0.0);
      }
    }
  }
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
    // Fresh sums (the saved options, the weights loaded) would train otherwise: the match
    // above is the saved state's doing.
    const auto weights_only = save_and_resume(adagrad_spec(2, client, false),
                                              adagrad_spec(2, client, false), false);
    EXPECT_NE(weights_only.losses, tail);
  }
}

// Saved on 2 ranks at stage 2, loaded on 1 or 4 ranks at stages 0-3, with one parameter group or
// two: each rank assembles its partition's sums from the saved fragments, and training goes on as
// the uninterrupted run (only summation orders differ). Without the optimizer states (the
// saved options, the weights loaded) it would train otherwise: fresh sums.
TEST(AdagradCheckpoint, ResumesAtAnotherWorldSizeAndStage) {
  for (bool client : {true, false}) {
    for (bool two_groups : {false, true}) {
      SCOPED_TRACE(std::string(client ? "client" : "config") + " Adagrad" +
                   (two_groups ? ", two groups" : ""));
      const auto saving = adagrad_spec(2, client, false, 2, two_groups);
      const auto uninterrupted = dstest::train_gpt(saving);
      const std::vector<double> tail(uninterrupted.losses.begin() + kAdagradSaveAt,
                                     uninterrupted.losses.end());
      // Without the state: measured 6.1e-4 apart.
      expect_reshards(adagrad_spec, saving, client, two_groups, tail, kAdagradSaveAt, 1e-4);
    }
  }
}

// Saved before the first step. At stage 2 a client Adagrad's sums are not made yet (the stage
// cleared those its constructor made: they were for the module's parameters), so the save makes
// them as the step would (initial_accumulator_value) and the resumed job steps as the
// uninterrupted one, bit for bit. Zeros saved instead would make its first step lr·g/|g|.
TEST(AdagradCheckpoint, SavedBeforeTheFirstStepResumesBitForBit) {
  expect_step_zero_resumes_bit_for_bit(adagrad_spec, "Adagrad");
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

// ---- SGD checkpoints under ZeRO ----
// SGD's momentum buffers are saved per element ("sgd_fragments", docs/checkpoints.md), with its
// groups' options (momentum, dampening, weight decay, nesterov). Whether the buffers exist is
// the format's step (1, or 0 before the first step): torch's first step copies the gradient into
// a new buffer, a later one scales the buffer and adds (1 - dampening)·gradient.
namespace {
constexpr int kSgdSaveAt = 4;

// As adagrad_spec: the config's SGD or a client's torch::optim::SGD, options that differ between
// the saving and the resuming job (`resumed`: no momentum at all, so the saved options decide
// which groups keep buffers). Dampening, so that a first step and a later one differ.
// `two_groups`: the vectors in a group of their own without momentum (they keep no buffer).
dstest::RunSpec sgd_spec(int world, bool client, bool resumed, int stage = 2,
                         bool two_groups = false) {
  dstest::RunSpec s = resume_run(world, stage);
  const double lr = resumed ? 0.3 : 0.1, momentum = resumed ? 0.0 : 0.9,
               dampening = resumed ? 0.0 : 0.25, decay = resumed ? 0.0 : 0.01;
  const auto options =
      torch::optim::SGDOptions(lr).momentum(momentum).dampening(dampening).weight_decay(decay);
  if (client) {
    s.config.erase("optimizer");
    s.client_optimizer = [=](gpt::GPTImpl& m) {
      if (!two_groups) return std::make_shared<torch::optim::SGD>(m.parameters(), options);
      auto [matrices, vectors] = dstest::matrices_and_vectors(m);
      auto plain = std::make_unique<torch::optim::SGDOptions>(options);
      plain->momentum(0).dampening(0);
      return std::make_shared<torch::optim::SGD>(
          std::vector<torch::optim::OptimizerParamGroup>{
              torch::optim::OptimizerParamGroup(vectors, std::move(plain)),
              torch::optim::OptimizerParamGroup(matrices)},
          options);
    };
  } else {
    s.config["optimizer"] = {{"type", "SGD"},
                             {"params",
                              {{"lr", lr},
                               {"momentum", momentum},
                               {"dampening", dampening},
                               {"weight_decay", decay}}}};
    if (two_groups)
      s.model_parameters = [=](gpt::GPTImpl& m) {
        auto [matrices, vectors] = dstest::matrices_and_vectors(m);
        return std::vector<deepspeed::ParamGroup>{
            {vectors, {{"momentum", 0.0}, {"dampening", 0.0}}}, {matrices, json::object()}};
      };
  }
  return s;
}
}  // namespace

// Saved on 2 ranks at stage 2, resumed at the same layout (bit for bit), and on 1 or 4 ranks at
// stages 0-3 (each rank assembles its partition's buffers from the fragments; only summation
// orders differ), with one parameter group or two (one without momentum). The resumed job is
// built with other options: the saved ones must win. Without the optimizer states (the saved
// options, the weights loaded) it trains otherwise: no buffers.
TEST(SgdCheckpoint, ResumesAtAnotherWorldSizeAndStage) {
  for (bool client : {true, false}) {
    for (bool two_groups : {false, true}) {
      SCOPED_TRACE(std::string(client ? "client torch::optim::SGD" : "config \"SGD\"") +
                   (two_groups ? ", two groups" : ""));
      const auto saving = sgd_spec(2, client, false, 2, two_groups);
      const auto uninterrupted = dstest::train_gpt(saving);
      const std::vector<double> tail(uninterrupted.losses.begin() + kSgdSaveAt,
                                     uninterrupted.losses.end());
      {
        dstest::TempDir dir;
        auto first = saving;
        first.steps = kSgdSaveAt;
        first.after_training = [&](deepspeed::Engine& e) { e.save_checkpoint(dir.path()); };
        dstest::train_gpt(first);
        const auto saved = dstest::consolidated_state(dir.path());
        EXPECT_EQ(saved.meta["optimizer"]["format"], "sgd_fragments");
        EXPECT_EQ(saved.meta["optimizer"]["adam_step"], 1);
        ASSERT_EQ(saved.momentum_buffer.size(), saved.fp32.size());
        int64_t nonzero = 0;
        for (const auto& [name, buffer] : saved.momentum_buffer)
          nonzero += buffer.ne(0).sum().item<int64_t>();
        EXPECT_GT(nonzero, 0);
      }
      const auto same =
          save_and_resume(saving, sgd_spec(2, client, true, 2, two_groups), true, kSgdSaveAt);
      EXPECT_EQ(same.losses, tail);  // bit for bit
      EXPECT_EQ(dstest::max_weight_diff(same, uninterrupted), 0.0);
      // Without the state: measured 2.2e-2 and 2.6e-2 apart.
      expect_reshards(sgd_spec, saving, client, two_groups, tail, kSgdSaveAt, 1e-3);
    }
  }
}

// Saved before the first step: no buffers yet, so the resumed job's first step copies the
// gradient into new ones, as the uninterrupted job's does (bit for bit). Zero buffers kept
// instead would make it (1 - dampening)·gradient.
TEST(SgdCheckpoint, SavedBeforeTheFirstStepResumesBitForBit) {
  expect_step_zero_resumes_bit_for_bit(sgd_spec, "SGD");
}

// Over a ZeRO partition with two groups the first step makes one buffer per view of the group
// with momentum; they are moved into one partition-sized tensor right after it (what a save
// reads), so every buffer is a slice of one storage and the memory report counts it once:
// about one fp32 per element of the rank's partition on two ranks.
TEST(SgdCheckpoint, GroupViewsKeepSlicesOfOnePartitionBuffer) {
  for (int stage : {1, 2, 3}) {
    for (bool client : {true, false}) {
      SCOPED_TRACE(std::string(client ? "client" : "config") + " SGD, stage " +
                   std::to_string(stage));
      auto s = sgd_spec(2, client, false, stage, /*two_groups=*/true);
      s.steps = 2;
      auto [r, storages] = dstest::train_measuring(s, [](deepspeed::Engine& e) {
        std::set<const void*> distinct;
        for (auto& [key, state] : e.optimizer()->state())
          distinct.insert(dynamic_cast<torch::optim::SGDParamState&>(*state)
                              .momentum_buffer()
                              .storage()
                              .unsafeGetStorageImpl());
        return static_cast<int64_t>(distinct.size());
      });
      const int64_t psi = dstest::count_parameters(s.model);
      for (int rank = 0; rank < 2; ++rank) {
        EXPECT_EQ(storages[rank], 1) << "rank " << rank;
        EXPECT_NEAR(r.memory[rank].optimizer_states, 2 * psi, 0.05 * psi) << "rank " << rank;
      }
    }
  }
}

// Every rank saves the job's step, also one whose partition lies wholly in groups without
// momentum (it has no buffer, so its own step reads 0): at world size 4 only the embedding (laid
// last in the flat buffer) keeps one. Rank 0's own step in the manifest would make the load drop
// every buffer.
TEST(SgdCheckpoint, ARankWithoutBuffersSavesTheJobsStep) {
  auto spec = [](bool resumed) {
    auto s = sgd_spec(4, false, resumed, 2);
    s.config["optimizer"]["params"]["momentum"] = 0.0;
    s.config["optimizer"]["params"]["dampening"] = 0.0;
    s.model_parameters = [](gpt::GPTImpl& m) {
      std::vector<at::Tensor> embedding, rest;
      for (auto& item : m.named_parameters())
        (item.key() == "wte.weight" ? embedding : rest).push_back(item.value());
      return std::vector<deepspeed::ParamGroup>{
          {embedding, {{"momentum", 0.9}, {"dampening", 0.25}}}, {rest, json::object()}};
    };
    return s;
  };
  const auto uninterrupted = dstest::train_gpt(spec(false));
  const std::vector<double> tail(uninterrupted.losses.begin() + kSgdSaveAt,
                                 uninterrupted.losses.end());
  const auto resumed = save_and_resume(spec(false), spec(true), true, kSgdSaveAt);
  EXPECT_EQ(resumed.losses, tail);
  EXPECT_EQ(dstest::max_weight_diff(resumed, uninterrupted), 0.0);
}

// A refused load (the checkpoint has two parameter groups, the engine one) leaves a fresh SGD
// without buffers, as it was: training on from there is the run that never tried, bit for bit.
// (Zero buffers left by the refused plan would make the first step (1 - dampening)·g.)
TEST(SgdCheckpoint, ARefusedLoadLeavesNoBuffers) {
  for (int stage : {0, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    dstest::TempDir dir;
    auto saving = sgd_spec(2, false, false, stage, /*two_groups=*/true);
    saving.steps = 1;
    saving.after_training = [&](deepspeed::Engine& e) { e.save_checkpoint(dir.path()); };
    dstest::train_gpt(saving);
    const auto never_tried = dstest::train_gpt(sgd_spec(2, false, false, stage));
    auto trying = sgd_spec(2, false, false, stage);
    trying.before_training = [&](deepspeed::Engine& e) {
      EXPECT_CONTAINS(dstest::message_of<deepspeed::CheckpointError>(
                          [&] { e.load_checkpoint(dir.path()); }),
                      "parameter group");
    };
    const auto tried = dstest::train_gpt(trying);
    EXPECT_EQ(tried.losses, never_tried.losses);
    EXPECT_EQ(dstest::max_weight_diff(tried, never_tried), 0.0);
  }
}

}  // namespace client_optimizer_test
