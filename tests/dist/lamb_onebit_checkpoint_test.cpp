// Checkpoints of Lamb and the 1-bit family. Their per-element state is Adam's (step, exp_avg,
// exp_avg_sq: for the 1-bit optimizers the variance is the frozen one), saved as Adam's
// fragments; the 1-bit optimizers' own state (error feedback; 0/1 Adam's local updates between
// syncs; 1-bit Lamb's fresh variance and ratios) is saved beside it (optim/extra_state.h):
//   - Lamb resumes bit-exact, and reshards (saved on 2 ranks at stage 2, loaded on 1 at stage 0);
//   - 1-bit Adam, 0/1 Adam (saved between two syncs, where each rank holds its own parameters
//     and momentum) and 1-bit Lamb resume bit-exact at the same world size;
//   - at another world size the per-rank state restarts (DeepSpeed resets the error feedback on
//     every load) and training goes on: 1-bit Lamb keeps its replicated state.
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

struct OneBitCase {
  std::string name;
  json optimizer;
  int save_at, steps;
  int reshard_save_at;  // where to save for a load at another world size
};

const std::vector<OneBitCase>& one_bit_cases() {
  static const std::vector<OneBitCase> cases = {
      {"OneBitAdam", {{"type", "OneBitAdam"}, {"params", {{"lr", 3e-3}, {"freeze_step", 3}}}}, 8, 12, 8},
      // var_freeze_step 4, scalers 2/2, clipper 4: syncs at steps 8, 12, 16 (zero_one_adam_test);
      // saved at step 10, between two syncs, where each rank holds its own parameters and
      // momentum and its local updates wait for step 12.
      {"ZeroOneAdam",
       {{"type", "ZeroOneAdam"},
        {"params", {{"lr", 1e-3}, {"var_freeze_step", 4}, {"var_update_scaler", 2},
                    {"local_step_scaler", 2}, {"local_step_clipper", 4}}}},
       10, 14, 8},  // resharded from a sync: the local updates since one are per rank
      {"OneBitLamb",
       {{"type", "OneBitLamb"}, {"params", {{"lr", 0.03}, {"weight_decay", 0.01}, {"freeze_step", 3}}}},
       8, 12, 8},
  };
  return cases;
}

class OneBitCheckpoint : public ::testing::TestWithParam<size_t> {};

TEST_P(OneBitCheckpoint, ResumesBitExactAtTheSameWorldSize) {
  const OneBitCase& c = one_bit_cases()[GetParam()];
  auto config = with_optimizer(0, c.optimizer);
  auto r = save_and_resume(config, 2, config, 2, c.save_at, c.steps);
  ASSERT_EQ(r.resumed.start_step, c.save_at);
  std::vector<double> tail(r.whole.losses.begin() + c.save_at, r.whole.losses.end());
  EXPECT_EQ(r.resumed.losses, tail) << c.name;
  EXPECT_EQ(dstest::max_abs_diff(r.resumed.weights, r.whole.weights), 0.0) << c.name;
}

// Saved on 2 ranks, resumed on 1 with the same global batch: the per-rank state is not handed
// over (there is no rank to take it from), training goes on from the loaded weights and moments.
// Measured: the resumed mean of steps 9-12 within 1-4% of the 2-rank run's; asserted: 10%.
TEST_P(OneBitCheckpoint, AtAnotherWorldSizeThePerRankStateRestarts) {
  const OneBitCase& c = one_bit_cases()[GetParam()];
  auto saved = with_optimizer(0, c.optimizer), loaded = saved;
  loaded["train_micro_batch_size_per_gpu"] = 4;
  const int at = c.reshard_save_at;
  auto two_ranks = save_and_resume(saved, 2, saved, 2, at, c.steps);
  auto r = save_and_resume(saved, 2, loaded, 1, at, c.steps);
  ASSERT_EQ(r.resumed.losses.size(), static_cast<size_t>(c.steps - at));
  std::vector<double> tail(two_ranks.whole.losses.begin() + at, two_ranks.whole.losses.end());
  const double resumed = dstest::tail_mean(r.resumed.losses, tail.size());
  const double reference = dstest::tail_mean(tail, tail.size());
  std::cout << c.name << ": mean loss after resuming on 1 rank " << resumed << ", on 2 ranks "
            << reference << "\n";
  EXPECT_LT(std::abs(resumed - reference) / reference, 0.10) << c.name;
}

INSTANTIATE_TEST_SUITE_P(Optimizers, OneBitCheckpoint, ::testing::Values(0, 1, 2),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return one_bit_cases()[info.param].name;
                         });

// In bf16 the 1-bit Adams step stage 0's flat fp32 master (zero/flat_stage.h) and compress it per
// parameter segment: 1-bit Adam saved after its freeze and 0/1 Adam saved at a sync or between
// two syncs (each rank's own masters, restored with the extra state and written into the 16-bit
// weights after it) resume bit for bit as well (masters, moments, error feedback).
TEST(OneBitCheckpoint16Bit, Bf16ResumesBitExactAtTheSameWorldSize) {
  for (size_t i : {0u, 1u}) {
    const OneBitCase& c = one_bit_cases()[i];
    auto config = with_optimizer(0, c.optimizer);
    config["bf16"] = {{"enabled", true}};
    for (int at : {c.reshard_save_at, c.save_at}) {
      auto r = save_and_resume(config, 2, config, 2, at, c.steps);
      ASSERT_EQ(r.resumed.start_step, at) << c.name;
      std::vector<double> tail(r.whole.losses.begin() + at, r.whole.losses.end());
      EXPECT_EQ(r.resumed.losses, tail) << c.name << " saved at step " << at;
      EXPECT_EQ(dstest::max_abs_diff(r.resumed.weights, r.whole.weights), 0.0)
          << c.name << " saved at step " << at;
    }
  }
}
