// Checkpoints of Lamb, 1-bit Adam and 0/1 Adam. Their state is Adam's (step, exp_avg, exp_avg_sq:
// for the 1-bit optimizers the variance is the frozen one), saved as Adam's fragments:
//   - Lamb resumes bit-exact, and reshards (saved on 2 ranks at stage 2, loaded on 1 at stage 0);
//   - 1-bit Adam and 0/1 Adam resume with their weights, moments and frozen variance exact (the
//     first resumed loss equals the uninterrupted run's); their error-feedback buffers restart at
//     zero, as DeepSpeed resets them on load, so the trajectories part after the next compressed
//     exchange. Measured (1-bit Adam, steps 9-12): per-step losses differ by up to 8% (single
//     small batches, a variance frozen after 3 steps), their mean by 1.3-3.3% depending on the
//     build's rounding; asserted: the mean within 10% (training goes on from the loaded state). 0/1 Adam saved at a
//     sync (step 8) next communicates at step 12, so its losses 9-12 agree exactly.
#include <gtest/gtest.h>

#include <cmath>

#include "support/checkpoint_run.h"
#include "support/files.h"
#include "support/training_run.h"

using nlohmann::json;

namespace {

json with_optimizer(int stage, const json& optimizer) {
  json c = dstest::base_config(2, 1, stage);
  c["optimizer"] = optimizer;
  return c;
}

struct Resumed {
  dstest::CheckpointJobResult whole, resumed;
};

// `steps` uninterrupted, against a job saving at `save_at` and one resuming from it.
Resumed save_and_resume(const json& save_config, int save_world, const json& load_config,
                        int load_world, int save_at, int steps) {
  dstest::TempDir dir;
  dstest::CheckpointJob whole;
  whole.world_size = load_world;
  whole.config = load_config;
  whole.steps = steps;
  dstest::CheckpointJob first = whole;
  first.world_size = save_world;
  first.config = save_config;
  first.steps = save_at;
  first.save_dir = dir.path();
  first.save_at = {save_at};
  dstest::CheckpointJob second = whole;
  second.model_seed = 99;  // loading must win
  second.load_dir = dir.path();
  Resumed r;
  r.whole = dstest::run_checkpoint_job(whole);
  dstest::run_checkpoint_job(first);
  r.resumed = dstest::run_checkpoint_job(second);
  return r;
}

const json kLamb = {{"type", "Lamb"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.01}}}};

}  // namespace

TEST(LambCheckpoint, ResumesBitExact) {
  auto c = with_optimizer(2, kLamb);
  auto r = save_and_resume(c, 2, c, 2, 4, 8);
  ASSERT_EQ(r.resumed.start_step, 4);
  std::vector<double> tail(r.whole.losses.begin() + 4, r.whole.losses.end());
  EXPECT_EQ(r.resumed.losses, tail);
  EXPECT_EQ(dstest::max_abs_diff(r.resumed.weights, r.whole.weights), 0.0);
}

TEST(LambCheckpoint, ReshardsFromTwoRanksStageTwoToOneRankStageZero) {
  auto saved = with_optimizer(2, kLamb), loaded = with_optimizer(0, kLamb);
  loaded["train_micro_batch_size_per_gpu"] = 4;  // the same global batch on one rank
  auto r = save_and_resume(saved, 2, loaded, 1, 4, 8);
  // The uninterrupted reference runs on 1 rank: same global batches, summation order differs.
  std::vector<double> tail(r.whole.losses.begin() + 4, r.whole.losses.end());
  EXPECT_LT(dstest::max_rel_diff(r.resumed.losses, tail), dstest::kLossTol);
  EXPECT_LT(dstest::max_abs_diff(r.resumed.weights, r.whole.weights), dstest::kWeightTol);
}

class OneBitCheckpoint : public ::testing::TestWithParam<std::string> {};
TEST_P(OneBitCheckpoint, ResumesStateExactlyAndErrorFeedbackRestarts) {
  json optimizer;
  if (GetParam() == "OneBitAdam") {
    optimizer = {{"type", "OneBitAdam"}, {"params", {{"lr", 3e-3}, {"freeze_step", 3}}}};
  } else {  // syncs at steps 6, 7, 8: saved at a sync, as zero_one_adam.h asks
    optimizer = {{"type", "ZeroOneAdam"},
                 {"params", {{"lr", 1e-3}, {"var_freeze_step", 4}, {"var_update_scaler", 2},
                             {"local_step_scaler", 2}, {"local_step_clipper", 4}}}};
  }
  auto c = with_optimizer(0, optimizer);
  auto r = save_and_resume(c, 2, c, 2, 8, 12);
  ASSERT_EQ(r.resumed.losses.size(), 4u);
  EXPECT_EQ(r.resumed.losses[0], r.whole.losses[8]);  // weights after step 8 restored exactly
  std::vector<double> tail(r.whole.losses.begin() + 8, r.whole.losses.end());
  for (size_t i = 0; i < tail.size(); ++i)
    std::cout << "step " << 9 + i << ": uninterrupted " << tail[i] << ", resumed "
              << r.resumed.losses[i] << "\n";
  auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return s / v.size();
  };
  EXPECT_LT(std::abs(mean(r.resumed.losses) - mean(tail)) / mean(tail), 0.10);
  if (GetParam() == "ZeroOneAdam") EXPECT_EQ(r.resumed.losses, tail);
}
INSTANTIATE_TEST_SUITE_P(Optimizers, OneBitCheckpoint,
                         ::testing::Values("OneBitAdam", "ZeroOneAdam"));
