// A client optimizer with several parameter groups (HF's weight-decay group and a no-decay group
// for biases and LayerNorm weights) under ZeRO stages 1-3 and bf16: each group keeps its own lr
// and weight_decay while the stage steps its flat partition (zero/flat_groups.h): libtorch's
// optimizers over views of the master, FusedAdam over the master segment by segment, and under
// optimizer offload the CPU Adam range by range (overlap_step) and the NVMe swap sub-group by
// sub-group, each piece cut where the groups' segments meet. The reference is stage 0 in fp32,
// where the client steps the module's own parameters group by group.
#include <gtest/gtest.h>

#include "deepspeed/errors.h"
#include "optim/lamb.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/param_groups.h"
#include "support/training_run.h"

namespace param_groups_test {

namespace {
using nlohmann::json;
using ClientFactory = std::function<std::shared_ptr<torch::optim::Optimizer>(gpt::GPTImpl&)>;

constexpr int kSteps = 6;

// HF's two groups (support/param_groups.h): matrices decayed at lr 3e-3; vectors (biases,
// LayerNorm weights) at `vector_lr`, no decay; moved_by_group tells how far each moved.
using dstest::moved_by_group;
using dstest::two_adamw_groups;

ClientFactory client_adamw(double vector_lr = 1e-3) {
  return [vector_lr](gpt::GPTImpl& m) { return dstest::two_group_adamw(m, vector_lr); };
}

// The project's FusedAdam with the same two groups (its state is kept by the whole master).
ClientFactory client_fused_adam(double vector_lr = 1e-3) {
  return [vector_lr](gpt::GPTImpl& m) { return dstest::two_group_fused_adam(m, vector_lr); };
}

ClientFactory client_sgd() {
  return [](gpt::GPTImpl& m) {
    auto [matrices, vectors] = dstest::matrices_and_vectors(m);
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(matrices);
    groups.emplace_back(vectors, std::make_unique<torch::optim::SGDOptions>(
                                     torch::optim::SGDOptions(0.01).momentum(0.9)));
    return std::make_shared<torch::optim::SGD>(groups,
                                               torch::optim::SGDOptions(0.05).momentum(0.5));
  };
}

// libtorch's Adagrad, the vectors with their own lr_decay and accumulator start. Its state, made
// by its constructor only, is for the module's parameters, not the partition's views; and that
// constructor starts every group's sum at the defaults' initial_accumulator_value (0 here), not
// the group's 0.5 (where torch.optim.Adagrad reads the group's).
ClientFactory client_adagrad() {
  return [](gpt::GPTImpl& m) {
    auto [matrices, vectors] = dstest::matrices_and_vectors(m);
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(matrices);
    groups.emplace_back(vectors, std::make_unique<torch::optim::AdagradOptions>(
                                     torch::optim::AdagradOptions(0.01).lr_decay(0.1)
                                         .initial_accumulator_value(0.5)));
    return std::make_shared<torch::optim::Adagrad>(groups, torch::optim::AdagradOptions(0.02));
  };
}

dstest::RunSpec spec(int world, int stage, ClientFactory client, const json& extra = json()) {
  dstest::RunSpec s;
  s.world_size = world;
  s.steps = kSteps;
  s.config = dstest::base_config(2, 1, stage);
  s.config.erase("optimizer");
  if (stage == 3) s.config["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
  if (!extra.is_null()) s.config.merge_patch(extra);
  s.client_optimizer = std::move(client);
  return s;
}

dstest::RunResult run(int world, int stage, ClientFactory client, const json& extra = json()) {
  return dstest::train_gpt(spec(world, stage, std::move(client), extra));
}

std::string config_error_of(int stage, ClientFactory client, const json& extra = json()) {
  return dstest::message_of<deepspeed::ConfigError>([&] { run(1, stage, client, extra); });
}


// ZeRO-Offload's CPU Adam updating the partition range by range (zero/step_during_backward.h):
// overlap_step, which a CPU engine takes when asked (on a GPU it is the default, and the
// partition's place makes every step go range by range anyway).
const json kOverlappedCpuOffload = {
    {"zero_optimization", {{"offload_optimizer", {{"device", "cpu"}, {"overlap_step", true}}}}}};

// The swapped Adam (offload_optimizer "nvme") under `dir`, in sub-groups of 1000 elements: far
// smaller than a rank's partition of the test model, so most sub-groups cross a boundary between
// the groups' segments (a LayerNorm's or a bias's few elements between two matrices).
json nvme_offload(const std::string& dir) {
  return {{"zero_optimization",
           {{"offload_optimizer", {{"device", "nvme"}, {"nvme_path", dir}, {"buffer_count", 3}}},
            {"sub_group_size", 1000}}},
          {"aio", {{"block_size", 8192}, {"queue_depth", 4}}}};
}

// WarmupLR with one value per group: the matrices' lr climbs from 0 to 3e-3 over the run while
// the vectors' stays at 1e-3. The scheduler writes each group's lr before each step.
const json kPerGroupWarmup = {
    {"scheduler",
     {{"type", "WarmupLR"},
      {"params",
       {{"warmup_min_lr", {0.0, 1e-3}},
        {"warmup_max_lr", {3e-3, 1e-3}},
        {"warmup_num_steps", kSteps},
        {"warmup_type", "linear"}}}}}};
}  // namespace

// One rank: the partition is the whole model, so every stage runs libtorch's AdamW on the same
// elements with the same gradients as stage 0 does on the module's parameters, group by group.
TEST(ParamGroups, StagesOneToThreeStepEachGroupAsStageZero) {
  auto reference = run(1, 0, client_adamw());
  for (int stage : {1, 2, 3}) {
    auto zero = run(1, stage, client_adamw());
    EXPECT_LT(dstest::max_loss_rel_diff(zero, reference), dstest::kLossTol) << "stage " << stage;
    EXPECT_LT(dstest::max_weight_diff(zero, reference), 1e-6) << "stage " << stage;
    EXPECT_LT(dstest::max_grad_norm_rel_diff(zero, reference), dstest::kGradNormTol) << "stage " << stage;
  }
  // The groups' options matter: one group with the first group's options trains otherwise.
  auto one_group = run(1, 2, [](gpt::GPTImpl& m) {
    return std::make_shared<torch::optim::AdamW>(m.parameters(),
                                                 torch::optim::AdamWOptions(3e-3).weight_decay(0.1));
  });
  EXPECT_GT(dstest::max_weight_diff(one_group, reference), 1e-4);
}

// FusedAdam steps the master segment by segment with each group's options.
TEST(ParamGroups, FusedAdamGroupsStepAsStageZero) {
  auto reference = run(1, 0, client_fused_adam());
  for (int stage : {2, 3}) {
    auto zero = run(1, stage, client_fused_adam());
    EXPECT_LT(dstest::max_weight_diff(zero, reference), 1e-6) << "stage " << stage;
  }
  auto adamw = run(1, 0, client_adamw());  // the same groups in libtorch's AdamW
  EXPECT_LT(dstest::max_weight_diff(adamw, reference), 1e-5);
}

TEST(ParamGroups, SgdGroupsAtStageTwoStepAsStageZero) {
  auto reference = run(1, 0, client_sgd());
  auto zero = run(1, 2, client_sgd());
  EXPECT_LT(dstest::max_weight_diff(zero, reference), 1e-6);
}

// Each group's views of the master get, at their first step, the state the client's
// constructor made for the module's parameters, and step with their group's options, as stage 0
// steps the module's parameters; two ranks cut parameters in two.
TEST(ParamGroups, AdagradGroupsOnTwoRanksStepAsStageZero) {
  auto reference = run(2, 0, client_adagrad());
  for (int stage : {2, 3}) {
    auto zero = run(2, stage, client_adagrad());
    EXPECT_LT(dstest::max_loss_rel_diff(zero, reference), dstest::kLossTol) << "stage " << stage;
    EXPECT_LT(dstest::max_weight_diff(zero, reference), 1e-6) << "stage " << stage;
    EXPECT_LT(dstest::max_grad_norm_rel_diff(zero, reference), dstest::kGradNormTol) << "stage " << stage;
  }
}

// bf16 at stage 0 (a replicated flat partition) and stage 2 run the same fp32 masters; against
// fp32 they agree to bf16 precision.
TEST(ParamGroups, Bf16StepsEachGroupsMasters) {
  const json bf16 = {{"bf16", {{"enabled", true}}}};
  for (const auto& client : {client_adamw(), client_fused_adam()}) {
    auto reference = run(1, 0, client);
    auto stage0 = run(1, 0, client, bf16);
    auto stage2 = run(1, 2, client, bf16);
    EXPECT_EQ(dstest::max_weight_diff(stage2, stage0), 0.0);
    EXPECT_LT(dstest::max_grad_norm_rel_diff(stage2, stage0), dstest::kBf16GradNormTol);
    EXPECT_LT(dstest::max_loss_rel_diff(stage0, reference), 4e-3);
  }
}

// Two ranks split the partition inside parameters: a group at lr 0 (and no decay) keeps every
// element of its parameters bit for bit, wherever the partition boundary cuts them, while the
// other group trains.
TEST(ParamGroups, GroupAtLrZeroKeepsItsParametersOnTwoRanks) {
  for (int stage : {1, 2, 3}) for (bool fused : {false, true}) {
    auto r = run(2, stage, fused ? client_fused_adam(/*vector_lr=*/0.0) : client_adamw(0.0));
    ASSERT_EQ(r.weights.size(), r.initial.size());
    const auto m = moved_by_group(r);
    EXPECT_EQ(m.vectors, 0.0) << "stage " << stage << " fused " << fused;
    EXPECT_GT(m.matrices, 0.0) << "stage " << stage << " fused " << fused;
  }
}

// Two ranks with clipping that always acts (the global norm is far above 1e-3): the gradients
// are scaled once for the whole partition (the views' slices of it, FusedAdam's grad_scale per
// segment), then each group steps with its own options, as stage 0 does on the module's
// parameters. Also catches a group stepped with the other's options anywhere in a partition.
TEST(ParamGroups, ClippedGradientsOnTwoRanksStepEachGroupAsStageZero) {
  const json clipped = {{"gradient_clipping", 1e-3}};
  for (bool fused : {false, true}) {
    auto client = fused ? client_fused_adam() : client_adamw();
    auto reference = run(2, 0, client, clipped);
    auto unclipped = run(2, 0, client);
    // Clipping moves the weights far beyond the tolerance below (measured: 0.013), so a segment
    // stepped unclipped would show.
    EXPECT_GT(dstest::max_weight_diff(reference, unclipped), 10 * dstest::kWeightTol)
        << "clipping acted";
    for (int stage : {1, 2, 3}) {
      auto zero = run(2, stage, client, clipped);
      EXPECT_LT(dstest::max_loss_rel_diff(zero, reference), dstest::kLossTol)
          << "stage " << stage << " fused " << fused;
      EXPECT_LT(dstest::max_weight_diff(zero, reference), dstest::kWeightTol)
          << "stage " << stage << " fused " << fused;
      EXPECT_LT(dstest::max_grad_norm_rel_diff(zero, reference), dstest::kGradNormTol)
          << "stage " << stage << " fused " << fused;
    }
  }
}

// Stage 2 on two ranks, saved after 3 steps and resumed for 3 more: the same weights as 6 steps
// in one go (libtorch's optimizer archive keeps each group's moments per view).
// FusedAdam's masters and moments are saved per parameter name, as with one group.
TEST(ParamGroups, SaveAndResumeAtStageTwoIsBitForBit) {
  for (const auto& client : {client_adamw(), client_fused_adam()}) {
    dstest::TempDir dir;
    auto whole = run(2, 2, client);
    auto first = spec(2, 2, client);
    first.steps = 3;
    first.after_training = [&](deepspeed::Engine& e) { e.save_checkpoint(dir.path(), "half"); };
    dstest::train_gpt(first);
    auto second = spec(2, 2, client);
    second.model_seed = 99;  // loading must win
    second.before_training = [&](deepspeed::Engine& e) { e.load_checkpoint(dir.path(), "half"); };
    auto resumed = dstest::train_gpt(second);
    ASSERT_EQ(resumed.losses.size(), 3u);
    EXPECT_EQ(dstest::max_abs_diff(resumed.weights, whole.weights), 0.0);
  }
}

// Offload "cpu": an AdamW client becomes the CPU Adam (FusedAdam) with one group per client
// group, which is what a FusedAdam client runs without offload. A libtorch optimizer stepping
// the masters in memory (zero_force_ds_cpu_optimizer false) keeps its groups.
TEST(ParamGroups, CpuOffloadKeepsTheGroups) {
  const json cpu = {{"zero_optimization", {{"offload_optimizer", {{"device", "cpu"}}}}}};
  auto offloaded_adamw = run(1, 2, client_adamw(), cpu);
  auto fused = run(1, 2, client_fused_adam());
  EXPECT_EQ(dstest::max_weight_diff(offloaded_adamw, fused), 0.0);
  // Every group's options are read: amsgrad in the second one is refused as in the first.
  auto amsgrad = [](gpt::GPTImpl& m) {
    auto groups = two_adamw_groups(m, 1e-3);
    static_cast<torch::optim::AdamWOptions&>(groups[1].options()).amsgrad(true);
    return std::make_shared<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(3e-3));
  };
  EXPECT_CONTAINS(config_error_of(2, amsgrad, cpu), "amsgrad");
  // The nvme swap is an Adam update: another optimizer is refused for that, not for its groups.
  dstest::TempDir dir;
  json nvme = nvme_offload(dir.path());
  nvme["zero_force_ds_cpu_optimizer"] = false;
  EXPECT_CONTAINS(config_error_of(3, client_sgd(), nvme), "the nvme swap is an Adam update");

  json not_forced = cpu;
  not_forced["zero_force_ds_cpu_optimizer"] = false;
  auto offloaded = run(1, 2, client_sgd(), not_forced);
  auto reference = run(1, 0, client_sgd());
  EXPECT_LT(dstest::max_weight_diff(offloaded, reference), 1e-6);
}

// The CPU Adam updating range by range during backward (overlap_step) on two ranks: each range
// is cut at the groups' segment boundaries and each part stepped with its group's options, as
// stage 0 steps the module's parameters group by group (the same kernel: a FusedAdam client).
// A group at lr 0 keeps its elements bit for bit wherever the buckets' ranges cut them.
TEST(ParamGroups, CpuOffloadUpdatingRangeByRangeStepsEachGroupAsStageZero) {
  auto reference = run(2, 0, client_fused_adam());
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    auto offloaded = run(2, stage, client_adamw(), kOverlappedCpuOffload);
    EXPECT_LT(dstest::max_loss_rel_diff(offloaded, reference), dstest::kLossTol);
    EXPECT_LT(dstest::max_weight_diff(offloaded, reference), dstest::kWeightTol);
    EXPECT_LT(dstest::max_grad_norm_rel_diff(offloaded, reference), dstest::kGradNormTol);
    const auto m =
        moved_by_group(run(2, stage, client_adamw(/*vector_lr=*/0.0), kOverlappedCpuOffload));
    EXPECT_EQ(m.vectors, 0.0);
    EXPECT_GT(m.matrices, 0.0);
  }
}

// The swapped Adam steps sub-group by sub-group; a sub-group crossing a segment boundary is
// split, each part stepped with its group's options. Stages 1 and 2 and 3, two ranks.
TEST(ParamGroups, NvmeOptimizerOffloadStepsEachGroupAsStageZero) {
  auto reference = run(2, 0, client_fused_adam());
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    dstest::TempDir dir, zero_lr_dir;
    auto swapped = run(2, stage, client_adamw(), nvme_offload(dir.path()));
    EXPECT_LT(dstest::max_loss_rel_diff(swapped, reference), dstest::kLossTol);
    EXPECT_LT(dstest::max_weight_diff(swapped, reference), dstest::kWeightTol);
    EXPECT_LT(dstest::max_grad_norm_rel_diff(swapped, reference), dstest::kGradNormTol);
    const auto m = moved_by_group(
        run(2, stage, client_adamw(/*vector_lr=*/0.0), nvme_offload(zero_lr_dir.path())));
    EXPECT_EQ(m.vectors, 0.0);
    EXPECT_GT(m.matrices, 0.0);
  }
}

// A scheduler that moves one group's lr every step: the range step (overlap_step) and the swap
// read each group's options when the step begins, as stage 0's optimizer does.
TEST(ParamGroups, PerGroupScheduleIsFollowedRangeByRangeAndSwapped) {
  auto reference = run(2, 0, client_fused_adam(), kPerGroupWarmup);
  // The schedule matters (measured far beyond the tolerance below), so a step that kept the lr
  // it was built with, or gave every group the same, would show.
  EXPECT_GT(dstest::max_weight_diff(reference, run(2, 0, client_fused_adam())),
            10 * dstest::kWeightTol);
  json overlapped = kPerGroupWarmup;
  overlapped.merge_patch(kOverlappedCpuOffload);
  auto offloaded = run(2, 2, client_adamw(), overlapped);
  EXPECT_LT(dstest::max_loss_rel_diff(offloaded, reference), dstest::kLossTol);
  EXPECT_LT(dstest::max_weight_diff(offloaded, reference), dstest::kWeightTol);
  EXPECT_LT(dstest::max_grad_norm_rel_diff(offloaded, reference), dstest::kGradNormTol);
  dstest::TempDir dir;
  json nvme = kPerGroupWarmup;
  nvme.merge_patch(nvme_offload(dir.path()));
  auto swapped = run(2, 3, client_adamw(), nvme);
  EXPECT_LT(dstest::max_loss_rel_diff(swapped, reference), dstest::kLossTol);
  EXPECT_LT(dstest::max_weight_diff(swapped, reference), dstest::kWeightTol);
  EXPECT_LT(dstest::max_grad_norm_rel_diff(swapped, reference), dstest::kGradNormTol);
}

TEST(ParamGroups, GroupsThatDoNotCoverTheTrainableParametersOnceAreRefused) {
  auto twice = [](gpt::GPTImpl& m) {
    auto groups = two_adamw_groups(m, 1e-3);
    groups[1].params().push_back(groups[0].params().front());
    return std::make_shared<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(3e-3));
  };
  EXPECT_CONTAINS(config_error_of(2, twice), "in parameter groups 0 and 1");
  auto missing = [](gpt::GPTImpl& m) {
    auto groups = two_adamw_groups(m, 1e-3);
    groups[1].params().pop_back();
    return std::make_shared<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(3e-3));
  };
  EXPECT_CONTAINS(config_error_of(3, missing), "trainable parameters in its parameter groups");
  auto foreign = [](gpt::GPTImpl& m) {
    auto groups = two_adamw_groups(m, 1e-3);
    groups[1].params().push_back(torch::zeros({3}, torch::requires_grad()));
    return std::make_shared<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(3e-3));
  };
  EXPECT_CONTAINS(config_error_of(1, foreign), "parameter group 1 holds a tensor that is not");
}

// Lamb keeps per-parameter trust-ratio fragments of its one tensor: several groups are refused
// under ZeRO, naming it and the way out.
TEST(ParamGroups, LambWithSeveralGroupsIsRefused) {
  auto lamb = [](gpt::GPTImpl& m) {
    auto groups = two_adamw_groups(m, 1e-3);
    auto optimizer =
        std::make_shared<deepspeed::optim::Lamb>(groups[0].params(), deepspeed::optim::LambHyper{});
    optimizer->add_param_group(torch::optim::OptimizerParamGroup(
        groups[1].params(), optimizer->param_groups()[0].options().clone()));
    return optimizer;
  };
  const std::string msg = config_error_of(2, lamb);
  EXPECT_CONTAINS(msg, "InitializeArgs.optimizer is Lamb with 2 parameter groups");
  EXPECT_CONTAINS(msg, "give one group");
}

}  // namespace param_groups_test
