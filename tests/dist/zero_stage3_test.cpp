// ZeRO stage 3 against stage 0 on the same ranks (fp32), world sizes 1-4. As for stages 1/2 the
// only differences are summation orders (reduce-scatter vs all-reduce), so losses agree to 1e-5
// relative and weights to kWeightTol (2e-4) absolute. Every parameter is partitioned (persistence threshold 0)
// unless a case says otherwise.
#include <gtest/gtest.h>

#include "support/stage3_models.h"
#include "support/training_run.h"

namespace zero_stage3_test {

namespace {
using dstest::kLossTol;
using dstest::kWeightTol;
using dstest::kGradNormTol;

dstest::RunResult run_gpt(int world, int stage, int micro, int accumulation, nlohmann::json extra = {},
                          gpt::GPTConfig model = {256, 16, 2, 2, 32}) {
  dstest::RunSpec s;
  s.world_size = world;
  s.steps = 20;
  s.model = model;
  s.config = dstest::base_config(micro, accumulation, stage);
  if (stage == 3) s.config["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
  if (!extra.is_null()) s.config.merge_patch(extra);
  return dstest::train_gpt(s);
}

// Block of the test GPT (n_embd 32): 12,704 elements, padded to at most 12,736.
constexpr int64_t kBlock = 12736;
nlohmann::json tight() {  // one block gathered at a time, released at once, no prefetch room
  return {{"zero_optimization", {{"stage3_max_live_parameters", kBlock},
                                 {"stage3_max_reuse_distance", 0},
                                 {"stage3_prefetch_bucket_size", kBlock}}}};
}
nlohmann::json prefetching() {  // room for the next block: prefetched while the current one runs
  return {{"zero_optimization", {{"stage3_max_live_parameters", 2 * kBlock},
                                 {"stage3_max_reuse_distance", 0},
                                 {"stage3_prefetch_bucket_size", kBlock}}}};
}
}  // namespace

class Stage3Gpt : public ::testing::TestWithParam<int> {};

TEST_P(Stage3Gpt, SameLossesAndWeightsAsStage0) {
  const int world = GetParam();
  auto reference = run_gpt(world, 0, 2, 1);
  for (auto extra : {nlohmann::json{}, tight(), prefetching()}) {
    auto zero = run_gpt(world, 3, 2, 1, extra);
    ASSERT_EQ(zero.losses.size(), 20u);
    EXPECT_LT(dstest::max_loss_rel_diff(zero, reference), kLossTol) << extra.dump();
    EXPECT_LT(dstest::max_weight_diff(zero, reference), kWeightTol) << extra.dump();
    EXPECT_LT(dstest::max_grad_norm_rel_diff(zero, reference), kGradNormTol) << extra.dump();
  }
}

TEST_P(Stage3Gpt, WithAccumulationAndClipping) {
  const int world = GetParam();
  nlohmann::json clip = {{"gradient_clipping", 0.05}};
  auto reference = run_gpt(world, 0, 1, 3, clip);
  auto patch = tight();
  patch.merge_patch(clip);
  auto zero = run_gpt(world, 3, 1, 3, patch);
  EXPECT_LT(dstest::max_loss_rel_diff(zero, reference), kLossTol);
  EXPECT_LT(dstest::max_weight_diff(zero, reference), kWeightTol);
  EXPECT_LT(dstest::max_grad_norm_rel_diff(zero, reference), kGradNormTol);
}

INSTANTIATE_TEST_SUITE_P(Worlds, Stage3Gpt, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

class Stage3Models : public ::testing::TestWithParam<int> {};

template <class Model>
void expect_same_as_stage0(int world, int accumulation = 1) {
  auto reference = dstest::train_model<Model>(world, dstest::stage3_test_config(0, accumulation), 12);
  auto zero = dstest::train_model<Model>(world, dstest::stage3_test_config(3, accumulation), 12);
  ASSERT_EQ(zero.losses.size(), 12u);
  EXPECT_LT(dstest::max_rel_diff(zero.losses, reference.losses), kLossTol);
  EXPECT_LT(dstest::max_abs_diff(zero.weights, reference.weights), kWeightTol);
  EXPECT_LT(zero.losses.back(), reference.losses.front());  // it does train
}

TEST_P(Stage3Models, WeightSharedByTwoUnits) { expect_same_as_stage0<dstest::TiedModelImpl>(GetParam()); }
TEST_P(Stage3Models, UnitWeightTiedToTheRootsEmbedding) {
  expect_same_as_stage0<dstest::RootTiedModelImpl>(GetParam());
}
TEST_P(Stage3Models, UnitUsedTwiceInOneForward) {
  expect_same_as_stage0<dstest::TwiceModelImpl>(GetParam());
  expect_same_as_stage0<dstest::TwiceModelImpl>(GetParam(), /*accumulation=*/2);
}
TEST_P(Stage3Models, ParameterOutsideEveryUnit) { expect_same_as_stage0<dstest::OuterModelImpl>(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Worlds, Stage3Models, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

TEST(Stage3, OddSizesAndPersistentSmallParameters) {
  // n_embd 30, 3 heads, block 11: no world size divides the units evenly. Threshold 200 keeps
  // the LayerNorms and biases resident (root unit) while the matrices are partitioned.
  gpt::GPTConfig odd{256, 11, 1, 3, 30};
  auto reference = run_gpt(3, 0, 2, 1, {}, odd);
  auto zero = run_gpt(3, 3, 2, 1, {{"zero_optimization", {{"stage3_param_persistence_threshold", 200}}}}, odd);
  EXPECT_LT(dstest::max_loss_rel_diff(zero, reference), kLossTol);
  EXPECT_LT(dstest::max_weight_diff(zero, reference), kWeightTol);
  EXPECT_LT(dstest::max_grad_norm_rel_diff(zero, reference), kGradNormTol);
}

TEST(Stage3, BuiltUnderZeroInitTrainsLikeStage0FromTheSameStart) {
  dstest::RunSpec s;
  s.world_size = 2;
  s.steps = 10;
  s.zero_init = true;
  s.config = dstest::base_config(2, 1, 3);
  s.config["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
  auto zero = dstest::train_gpt(s);
  ASSERT_FALSE(zero.initial.empty());
  dstest::RunSpec ref = s;
  ref.zero_init = false;
  ref.initial_weights = zero.initial;
  ref.config = dstest::base_config(2, 1, 0);
  auto reference = dstest::train_gpt(ref);
  EXPECT_LT(dstest::max_loss_rel_diff(zero, reference), kLossTol);
  EXPECT_LT(dstest::max_weight_diff(zero, reference), kWeightTol);
  EXPECT_LT(dstest::max_grad_norm_rel_diff(zero, reference), kGradNormTol);
}

}  // namespace zero_stage3_test
