// InitializeArgs.model_parameters: DeepSpeed's parameter-group dicts for the optimizer the
// config's "optimizer" block builds (HF's weight-decay group and a no-decay group for biases and
// LayerNorm weights). Each group's options are laid over optimizer.params; the stages step the
// groups as they step a client optimizer's (zero/flat_groups.h). The reference is stage 0 in
// fp32, where the groups step the module's own parameters.
#include <gtest/gtest.h>

#include <tuple>

#include "deepspeed/errors.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/param_groups.h"
#include "support/training_run.h"

namespace model_parameters_test {

namespace {
using nlohmann::json;
using Groups = std::function<std::vector<deepspeed::ParamGroup>(gpt::GPTImpl&)>;

constexpr int kSteps = 6;

// Matrices with weight_decay 0.1 (over the block's 0.01) at the block's lr 3e-3; vectors
// (biases, LayerNorm weights) with `vector_options` (default: no decay at lr 1e-3).
Groups two_groups(json vector_options = {{"lr", 1e-3}, {"weight_decay", 0.0}}) {
  return [vector_options](gpt::GPTImpl& m) {
    auto [matrices, vectors] = dstest::matrices_and_vectors(m);
    return std::vector<deepspeed::ParamGroup>{{matrices, {{"weight_decay", 0.1}}},
                                              {vectors, vector_options}};
  };
}

// The same two groups as a client FusedAdam (what the "AdamW" block builds).
std::shared_ptr<torch::optim::Optimizer> client_fused_adam(gpt::GPTImpl& m) {
  return dstest::two_group_fused_adam(m, /*vector_lr=*/1e-3);
}

dstest::RunSpec spec(int world, int stage, Groups groups, const json& extra = json()) {
  dstest::RunSpec s;
  s.world_size = world;
  s.steps = kSteps;
  s.config = dstest::base_config(2, 1, stage);  // AdamW, lr 3e-3, weight_decay 0.01
  if (stage == 3) s.config["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
  if (!extra.is_null()) s.config.merge_patch(extra);
  s.model_parameters = std::move(groups);
  return s;
}

dstest::RunResult run(int world, int stage, Groups groups, const json& extra = json()) {
  return dstest::train_gpt(spec(world, stage, std::move(groups), extra));
}

std::string config_error_of(int stage, Groups groups, const json& extra = json()) {
  return dstest::message_of<deepspeed::ConfigError>([&] { run(1, stage, groups, extra); });
}

// How far rank 0's matrices and vectors moved over a run (support/param_groups.h).
using dstest::moved_by_group;

// The swapped Adam (offload_optimizer "nvme") under `dir`, in sub-groups of 1000 elements, far
// smaller than a rank's partition: most sub-groups cross a boundary between the groups' segments.
json nvme_offload(const std::string& dir) {
  return {{"zero_optimization",
           {{"offload_optimizer", {{"device", "nvme"}, {"nvme_path", dir}, {"buffer_count", 3}}},
            {"sub_group_size", 1000}}},
          {"aio", {{"block_size", 8192}, {"queue_depth", 4}}}};
}
}  // namespace

// At stage 0 in fp32 the groups are the client's groups of the same options: the block's AdamW
// over each group with its options laid over the block's, bit for bit.
TEST(ModelParameters, GroupsTakeTheirOptionsOverTheBlocks) {
  auto groups = run(1, 0, two_groups());
  auto s = spec(1, 0, nullptr);
  s.client_optimizer = client_fused_adam;
  auto client = dstest::train_gpt(s);
  EXPECT_EQ(dstest::max_weight_diff(groups, client), 0.0);
  // The options matter: without the groups (one group, the block's options) training differs.
  auto block = run(1, 0, nullptr);
  EXPECT_GT(dstest::max_weight_diff(block, groups), 1e-4);
}

// Two ranks split the partition inside parameters: every stage steps each element with its
// group's options, as stage 0 does on the module's parameters.
TEST(ModelParameters, StagesOneToThreeOnTwoRanksStepEachGroupAsStageZero) {
  auto reference = run(2, 0, two_groups());
  for (int stage : {1, 2, 3}) {
    auto zero = run(2, stage, two_groups());
    EXPECT_LT(dstest::max_loss_rel_diff(zero, reference), dstest::kLossTol) << "stage " << stage;
    EXPECT_LT(dstest::max_weight_diff(zero, reference), dstest::kWeightTol) << "stage " << stage;
    EXPECT_LT(dstest::max_grad_norm_rel_diff(zero, reference), dstest::kGradNormTol) << "stage " << stage;
  }
}

// A group at lr 0 (and no decay) keeps every element of its parameters bit for bit, wherever
// the partition boundary of two ranks cuts them, while the other group trains.
TEST(ModelParameters, GroupAtLrZeroKeepsItsParametersOnTwoRanks) {
  for (int stage : {0, 1, 2, 3}) {
    const auto moved =
        moved_by_group(run(2, stage, two_groups({{"lr", 0.0}, {"weight_decay", 0.0}})));
    EXPECT_EQ(moved.vectors, 0.0) << "stage " << stage;
    EXPECT_GT(moved.matrices, 0.0) << "stage " << stage;
  }
}

// bf16 at stage 0 (a replicated flat partition) and stages 2/3 run the same fp32 masters with the
// same groups; against fp32 they agree to bf16 precision.
TEST(ModelParameters, Bf16StepsEachGroupsMasters) {
  const json bf16 = {{"bf16", {{"enabled", true}}}};
  auto reference = run(2, 0, two_groups());
  auto stage0 = run(2, 0, two_groups(), bf16);
  EXPECT_LT(dstest::max_loss_rel_diff(stage0, reference), 4e-3);
  for (int stage : {2, 3}) {
    auto zero = run(2, stage, two_groups(), bf16);
    EXPECT_LT(dstest::max_loss_rel_diff(zero, stage0), 4e-3) << "stage " << stage;
    EXPECT_LT(dstest::max_grad_norm_rel_diff(zero, stage0), dstest::kBf16GradNormTol) << "stage " << stage;
  }
  const auto moved =
      moved_by_group(run(2, 2, two_groups({{"lr", 0.0}, {"weight_decay", 0.0}}), bf16));
  EXPECT_EQ(moved.vectors, 0.0);
  EXPECT_GT(moved.matrices, 0.0);
}

// "Adam" with offload_optimizer "cpu": the CPU Adam (FusedAdam) with one group per model group,
// the same update as without offload.
TEST(ModelParameters, AdamWithCpuOffloadStepsEachGroup) {
  const json adam = {{"optimizer", {{"type", "Adam"}}}};
  json offload = adam;
  offload["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
  for (int stage : {2, 3}) {
    auto in_memory = run(2, stage, two_groups(), adam);
    auto offloaded = run(2, stage, two_groups(), offload);
    EXPECT_EQ(dstest::max_weight_diff(offloaded, in_memory), 0.0) << "stage " << stage;
    EXPECT_LT(dstest::max_grad_norm_rel_diff(offloaded, in_memory), dstest::kGradNormTol) << "stage " << stage;
    auto reference = run(2, 0, two_groups(), adam);
    EXPECT_LT(dstest::max_weight_diff(offloaded, reference), dstest::kWeightTol);
  }
  const auto moved = moved_by_group(run(2, 2, two_groups({{"lr", 0.0}}), offload));
  EXPECT_EQ(moved.vectors, 0.0);
  EXPECT_GT(moved.matrices, 0.0);
}

// The pieces of an offloaded update cut where the groups' segments meet, each stepped with its
// group's options: the NVMe swap sub-group by sub-group, and the CPU Adam range by range during
// backward (overlap_step, which a CPU engine takes when asked). On two ranks they train as
// stage 0 with the same groups, and a group at lr 0 (no scheduler: its own lr holds) keeps its
// elements bit for bit.
TEST(ModelParameters, NvmeAndRangeByRangeCpuOffloadStepEachGroupAsStageZero) {
  const json overlapped = {
      {"zero_optimization", {{"offload_optimizer", {{"device", "cpu"}, {"overlap_step", true}}}}}};
  auto reference = run(2, 0, two_groups());
  const Groups frozen_vectors = two_groups({{"lr", 0.0}, {"weight_decay", 0.0}});
  for (int stage : {1, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    dstest::TempDir dir, zero_lr_dir;
    for (const auto& [what, offload, zero_lr] :
         {std::tuple{"nvme", nvme_offload(dir.path()), nvme_offload(zero_lr_dir.path())},
          {"cpu, overlap_step", overlapped, overlapped}}) {
      SCOPED_TRACE(what);
      auto offloaded = run(2, stage, two_groups(), offload);
      EXPECT_LT(dstest::max_loss_rel_diff(offloaded, reference), dstest::kLossTol);
      EXPECT_LT(dstest::max_weight_diff(offloaded, reference), dstest::kWeightTol);
      EXPECT_LT(dstest::max_grad_norm_rel_diff(offloaded, reference), dstest::kGradNormTol);
      const auto moved = moved_by_group(run(2, stage, frozen_vectors, zero_lr));
      EXPECT_EQ(moved.vectors, 0.0);
      EXPECT_GT(moved.matrices, 0.0);
    }
  }
}

// libtorch's SGD and Adagrad keep their options per group: momentum and lr_decay per group at
// stage 2 as at stage 0. (Adagrad's state for a group added after construction, or for the
// partition's views, is made at its first step.)
TEST(ModelParameters, SgdAndAdagradGroupsAtStageTwoStepAsStageZero) {
  const json sgd = {
      {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.05}, {"momentum", 0.5}}}}}};
  const json adagrad = {{"optimizer", {{"type", "Adagrad"}, {"params", {{"lr", 0.01}}}}}};
  const json sgd_vectors = {{"lr", 0.01}, {"momentum", 0.9}};
  const json adagrad_vectors = {{"lr_decay", 0.1}, {"initial_accumulator_value", 0.5}};
  for (const auto& [config, vectors] : {std::pair{sgd, sgd_vectors}, {adagrad, adagrad_vectors}}) {
    const std::string type = config["optimizer"]["type"];
    auto groups = [vectors = vectors](gpt::GPTImpl& m) {
      auto g = two_groups(vectors)(m);
      g[0].options = json::object();
      return g;
    };
    auto reference = run(1, 0, groups, config);
    auto zero = run(1, 2, groups, config);
    EXPECT_LT(dstest::max_weight_diff(zero, reference), 1e-6) << type;
    EXPECT_LT(dstest::max_grad_norm_rel_diff(zero, reference), dstest::kGradNormTol) << type;
    EXPECT_GT(dstest::max_weight_diff(run(1, 0, nullptr, config), reference), 1e-5) << type;
  }
}

// A config scheduler writes every group's lr, as DeepSpeed's schedulers do: WarmupLR replaces a
// group's own lr, WarmupCosineLR scales it. The groups' weight decay still differs, and stage 2
// on two ranks steps it as stage 0.
TEST(ModelParameters, SchedulerDrivesEveryGroup) {
  const json warmup = {
      {"scheduler",
       {{"type", "WarmupLR"},
        {"params", {{"warmup_min_lr", 0.0}, {"warmup_max_lr", 3e-3}, {"warmup_num_steps", 3}}}}}};
  std::vector<double> lrs;
  auto s = spec(2, 0, two_groups(), warmup);
  const auto read_lrs = [&lrs](deepspeed::Engine& e) {
    if (e.communicator()->rank() == 0) lrs = e.get_lr();  // (the same on every rank)
  };
  s.after_training = read_lrs;
  auto reference = dstest::train_gpt(s);
  EXPECT_EQ(lrs, (std::vector<double>{3e-3, 3e-3}));
  auto zero = run(2, 2, two_groups(), warmup);
  EXPECT_LT(dstest::max_weight_diff(zero, reference), dstest::kWeightTol);
  EXPECT_LT(dstest::max_grad_norm_rel_diff(zero, reference), dstest::kGradNormTol);
  // The second group's lr was replaced, its decay was not: the same groups with decay 0.1 in both
  // train otherwise.
  auto decayed = run(2, 0, two_groups({{"lr", 1e-3}, {"weight_decay", 0.1}}), warmup);
  EXPECT_GT(dstest::max_weight_diff(decayed, reference), 1e-5);
  const json cosine = {{"scheduler",
                        {{"type", "WarmupCosineLR"},
                         {"params", {{"total_num_steps", 20}, {"warmup_num_steps", 2}}}}}};
  s = spec(1, 2, two_groups(), cosine);
  s.after_training = read_lrs;
  dstest::train_gpt(s);
  ASSERT_EQ(lrs.size(), 2u);
  EXPECT_NEAR(lrs[1] / lrs[0], 1e-3 / 3e-3, 1e-12);
}

// Stages 0, 2 and 3 on two ranks, saved after 3 steps and resumed for 3 more under a scheduler:
// the same weights as 6 steps in one go.
TEST(ModelParameters, SaveAndResumeIsBitForBit) {
  const json warmup = {
      {"scheduler",
       {{"type", "WarmupLR"}, {"params", {{"warmup_max_lr", 3e-3}, {"warmup_num_steps", 4}}}}}};
  for (int stage : {0, 2, 3}) {
    dstest::TempDir dir;
    auto whole = run(2, stage, two_groups(), warmup);
    auto first = spec(2, stage, two_groups(), warmup);
    first.steps = 3;
    first.after_training = [&](deepspeed::Engine& e) { e.save_checkpoint(dir.path(), "half"); };
    dstest::train_gpt(first);
    auto second = spec(2, stage, two_groups(), warmup);
    second.model_seed = 99;  // loading must win
    second.before_training = [&](deepspeed::Engine& e) { e.load_checkpoint(dir.path(), "half"); };
    auto resumed = dstest::train_gpt(second);
    ASSERT_EQ(resumed.losses.size(), 3u);
    EXPECT_EQ(dstest::max_abs_diff(resumed.weights, whole.weights), 0.0) << "stage " << stage;
  }
}

TEST(ModelParameters, GroupsThatDoNotCoverTheTrainableParametersOnceAreRefused) {
  auto twice = [](gpt::GPTImpl& m) {
    auto g = two_groups()(m);
    g[1].params.push_back(g[0].params.front());
    return g;
  };
  std::string msg = config_error_of(2, twice);
  EXPECT_CONTAINS(msg, "InitializeArgs.model_parameters: a parameter (");
  EXPECT_CONTAINS(msg, "is in parameter groups 0 and 1");
  auto missing = [](gpt::GPTImpl& m) {
    auto g = two_groups()(m);
    g[1].params.pop_back();
    return g;
  };
  for (int stage : {0, 3}) {
    msg = config_error_of(stage, missing);
    EXPECT_CONTAINS(msg, "InitializeArgs.model_parameters holds");
    EXPECT_CONTAINS(msg, "trainable parameters in its parameter groups, not ");
  }
  auto foreign = [](gpt::GPTImpl& m) {
    auto g = two_groups()(m);
    g[1].params.push_back(torch::zeros({3}, torch::requires_grad()));
    return g;
  };
  EXPECT_CONTAINS(config_error_of(1, foreign),
                  "InitializeArgs.model_parameters parameter group 1 holds a tensor that is not");
  // A frozen parameter is not the optimizer's.
  auto s = spec(1, 2, two_groups());
  s.frozen = {"ln_f.bias"};
  msg = dstest::message_of<deepspeed::ConfigError>([&] { dstest::train_gpt(s); });
  EXPECT_CONTAINS(msg, "parameter group 1 holds a tensor that is not a trainable parameter");
}

TEST(ModelParameters, KeysAGroupCannotSetAreRefusedNamingGroupKeyAndType) {
  std::string msg = config_error_of(2, two_groups({{"lr", 1e-3}, {"momentum", 0.9}}));
  EXPECT_CONTAINS(msg, "InitializeArgs.model_parameters[1].options: \"momentum\"");
  EXPECT_CONTAINS(msg, "optimizer type AdamW");
  EXPECT_CONTAINS(msg, "a group may set: lr, betas, eps, weight_decay");
  // Settings of the whole optimizer stay in optimizer.params.
  msg = config_error_of(0, two_groups({{"adam_w_mode", false}}));
  EXPECT_CONTAINS(msg, "[1].options: \"adam_w_mode\" is not a per-group parameter");
  msg = config_error_of(0, two_groups({{"params", json::array()}}));
  EXPECT_CONTAINS(msg, "the tensors go in ParamGroup::params");
  // A bad value names the group.
  msg = config_error_of(2, two_groups({{"lr", -1.0}}));
  EXPECT_CONTAINS(msg, "InitializeArgs.model_parameters[1] (optimizer type AdamW");
  EXPECT_CONTAINS(msg, "lr");
  // SGD's per-group keys are SGD's.
  const json sgd = {{"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.05}}}}}};
  msg = config_error_of(2, two_groups({{"betas", {0.9, 0.99}}}), sgd);
  EXPECT_CONTAINS(msg, "[1].options: \"betas\"");
  EXPECT_CONTAINS(msg, "optimizer type SGD");
}

TEST(ModelParameters, RefusedWithAClientOptimizerWithoutABlockAndWhereGroupsAreNotTaken) {
  auto s = spec(1, 2, two_groups());
  s.client_optimizer = client_fused_adam;
  std::string msg = dstest::message_of<deepspeed::ConfigError>([&] { dstest::train_gpt(s); });
  EXPECT_CONTAINS(msg, "InitializeArgs.model_parameters and InitializeArgs.optimizer are both set");
  s = spec(1, 2, two_groups());
  s.config.erase("optimizer");
  msg = dstest::message_of<deepspeed::ConfigError>([&] { dstest::train_gpt(s); });
  EXPECT_CONTAINS(msg, "no \"optimizer\" block");
  const json lamb = {{"optimizer", {{"type", "Lamb"}}}};
  msg = config_error_of(2, two_groups(), lamb);
  EXPECT_CONTAINS(msg, "has 2 parameter groups; optimizer type Lamb");
  // The nvme swap is an Adam update: another type is refused for that, not for its groups.
  dstest::TempDir dir;
  json sgd_nvme = nvme_offload(dir.path());
  sgd_nvme["optimizer"] = {{"type", "SGD"}, {"params", {{"lr", 0.05}}}};
  msg = config_error_of(3, two_groups(json::object()), sgd_nvme);
  EXPECT_CONTAINS(msg, "needs the \"Adam\" or \"AdamW\" optimizer");
  // One group takes Lamb, with its options over the block's.
  auto one = [](gpt::GPTImpl& m) {
    return std::vector<deepspeed::ParamGroup>{{m.parameters(), {{"weight_decay", 0.0}}}};
  };
  json lamb_no_decay = lamb;
  lamb_no_decay["optimizer"]["params"] = {{"weight_decay", 0.0}};
  EXPECT_EQ(dstest::max_weight_diff(run(1, 2, one, lamb), run(1, 2, nullptr, lamb_no_decay)), 0.0);
}

}  // namespace model_parameters_test
