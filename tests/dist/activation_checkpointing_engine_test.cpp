// Activation checkpointing inside the engine: the example GPT with every block checkpointed trains
// to bit-identical losses and weights at ZeRO stages 0, 2 and 3 (stage 3 re-gathers a released
// block's weights for the recomputation), and the config block reaches deepspeed::checkpointing.
#include <gtest/gtest.h>

#include "deepspeed/checkpointing.h"
#include "support/training_run.h"

namespace activation_checkpointing_engine_test {

using dstest::base_config;
using dstest::RunSpec;
using dstest::train_gpt;

namespace {
dstest::RunResult run(int stage, bool checkpointing, nlohmann::json extra = nullptr) {
  RunSpec s;
  s.world_size = 2;
  s.steps = 6;
  s.model = gpt::GPTConfig{256, 16, 3, 2, 32};
  s.model.activation_checkpointing = checkpointing;
  s.config = base_config(2, 2, stage);
  if (!extra.is_null()) s.config.merge_patch(extra);
  return train_gpt(s);
}
}  // namespace

class CheckpointedGpt : public ::testing::TestWithParam<int> {};

// Bit-identical, not within a tolerance: the recomputation runs the same operators on the same
// values in the same order, and each parameter's gradient is still one sum per micro-batch.
TEST_P(CheckpointedGpt, SameLossesAndWeightsAsWithout) {
  const int stage = GetParam();
  auto plain = run(stage, false);
  auto checkpointed = run(stage, true);
  ASSERT_EQ(checkpointed.losses.size(), 6u);
  EXPECT_EQ(checkpointed.losses, plain.losses);
  EXPECT_EQ(dstest::max_weight_diff(checkpointed, plain), 0.0);
}

INSTANTIATE_TEST_SUITE_P(Stages, CheckpointedGpt, ::testing::Values(0, 2, 3),
                         [](const auto& info) { return "stage" + std::to_string(info.param); });

TEST(CheckpointingConfig, ProfileFromTheConfigBlockCountsRecomputations) {
  deepspeed::checkpointing::reset_stats();
  run(1, true, {{"activation_checkpointing", {{"profile", true}}}});
  const auto s = deepspeed::checkpointing::stats();
  // 2 ranks (threads of this process) x 6 steps x 2 micro-batches x 3 blocks.
  EXPECT_EQ(s.recomputes, 2 * 6 * 2 * 3);
  EXPECT_EQ(s.forwards, 2 * 6 * 2 * 3);
  EXPECT_EQ(s.saved_bytes, 0);
  EXPECT_GT(s.recompute_seconds, 0);
  deepspeed::checkpointing::configure(deepspeed::checkpointing::Options{});
}

}  // namespace activation_checkpointing_engine_test
