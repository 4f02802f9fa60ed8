// The comparison helpers of tests/support/training_run.h, on which every ZeRO-vs-stage-0
// equivalence test rests: a NaN or infinity on either side must make a difference +infinity
// (std::max(m, NaN) is m, so a run whose weights or losses went NaN used to compare as equal), and
// train_gpt refuses a run whose loss is not finite.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>

#include "support/expect.h"
#include "support/training_run.h"

namespace training_run_helpers_test {

namespace {
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<torch::Tensor> weights() { return {torch::ones({3}), torch::full({2, 2}, 0.5)}; }
}  // namespace

TEST(TrainingRunHelpers, MaxAbsDiffOfFiniteWeightsIsTheLargestDifference) {
  auto a = weights(), b = weights();
  EXPECT_EQ(dstest::max_abs_diff(a, b), 0.0);
  b[1][1][0] = 0.75;
  b[0][2] = 0.875;
  EXPECT_EQ(dstest::max_abs_diff(a, b), 0.25);
}

TEST(TrainingRunHelpers, ANanOrInfiniteWeightOnEitherSideMakesTheDifferenceInfinite) {
  for (float bad : {float(kNan), float(kInf)}) {
    for (int side : {0, 1}) {
      auto a = weights(), b = weights();
      // After a larger finite difference in an earlier tensor: the old std::max kept that one.
      b[0][0] = 2.0;
      (side == 0 ? a : b)[1][0][1] = bad;
      EXPECT_EQ(dstest::max_abs_diff(a, b), kInf) << "value " << bad << " on side " << side;
    }
    auto a = weights(), b = weights();
    a[1][1][1] = bad;
    b[1][1][1] = bad;  // the same non-finite value on both sides is no agreement
    EXPECT_EQ(dstest::max_abs_diff(a, b), kInf) << "value " << bad << " on both sides";
  }
}

TEST(TrainingRunHelpers, MaxRelDiffIsInfiniteForANanOrInfiniteValue) {
  EXPECT_EQ(dstest::max_rel_diff({2.0, 4.0}, {2.0, 5.0}), 0.2);
  EXPECT_EQ(dstest::max_rel_diff({0.0, 1.0}, {0.0, 1.0}), 0.0);  // 0 == 0 agrees
  EXPECT_EQ(dstest::max_rel_diff({1.5, kNan}, {1.0, 1.0}), kInf);
  EXPECT_EQ(dstest::max_rel_diff({kNan, 1.5}, {1.0, 1.0}), kInf);
  EXPECT_EQ(dstest::max_rel_diff({1.0, 1.0}, {1.0, kNan}), kInf);
  EXPECT_EQ(dstest::max_rel_diff({1.0, kInf}, {1.0, kInf}), kInf);
}

TEST(TrainingRunHelpers, RunComparisonsFailForANanWeightLossOrGradientNorm) {
  dstest::RunResult ref;
  ref.weights = weights();
  ref.losses = {5.5, 5.0, 4.5};
  ref.grad_norms = {1.25, 1.0, 0.75};
  dstest::RunResult run = ref;
  run.weights = weights();
  EXPECT_EQ(dstest::max_weight_diff(run, ref), 0.0);
  EXPECT_EQ(dstest::max_loss_rel_diff(run, ref), 0.0);
  EXPECT_EQ(dstest::max_grad_norm_rel_diff(run, ref), 0.0);

  run.weights[0][1] = kNan;
  run.losses[2] = kNan;
  run.grad_norms[1] = kNan;
  EXPECT_EQ(dstest::max_weight_diff(run, ref), kInf);
  EXPECT_EQ(dstest::max_loss_rel_diff(run, ref), kInf);
  EXPECT_EQ(dstest::max_grad_norm_rel_diff(run, ref), kInf);
  EXPECT_FALSE(dstest::max_weight_diff(run, ref) < dstest::kWeightTol);
  EXPECT_FALSE(dstest::max_loss_rel_diff(run, ref) < dstest::kLossTol);
}

TEST(TrainingRunHelpers, TrainGptRecordsEveryStepsGradientNorm) {
  dstest::RunSpec s;
  s.steps = 3;
  s.config = dstest::base_config(2, 2, 0);
  auto r = dstest::train_gpt(s);
  ASSERT_EQ(r.grad_norms.size(), 3u);
  for (double norm : r.grad_norms) {
    EXPECT_TRUE(std::isfinite(norm));
    EXPECT_GT(norm, 0.0);
  }
}

TEST(TrainingRunHelpers, TrainGptRefusesARunWhoseLossIsNotFinite) {
  dstest::RunSpec s;
  s.steps = 2;
  s.config = dstest::base_config(2, 1, 0);
  s.before_training = [](deepspeed::Engine& engine) {
    torch::NoGradGuard no_grad;
    engine.module().parameters()[0].fill_(kNan);
  };
  auto message = dstest::message_of<std::runtime_error>([&] { dstest::train_gpt(s); });
  EXPECT_CONTAINS(message, "train_gpt: the loss of step 1 is");
  EXPECT_CONTAINS(message, "nan");
}

}  // namespace training_run_helpers_test
