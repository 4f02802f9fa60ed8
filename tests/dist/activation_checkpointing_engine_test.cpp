// Activation checkpointing inside the engine: the example GPT with every block checkpointed trains
// to bit-identical losses and weights at ZeRO stages 0, 2 and 3 (stage 3 with every block
// partitioned and released after its forward, so the recomputation re-gathers it, within
// stage3_max_live_parameters), and the config block reaches deepspeed::checkpointing.
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

// The stage-3 case above keeps every block whole (the default persistence threshold, 1e5, is
// above every parameter of the test GPT, at most 4224 elements), so its recomputation gathers
// nothing. Here every block is partitioned (threshold 0), released as soon as it is done (reuse
// distance 0) and at most one block may be gathered at a time: each recomputation must gather
// its released block again, and still the run is bit-identical to the same stage-3 run without
// checkpointing (a gather returns the same values; the recomputation runs the same operators).
TEST(CheckpointedGptStage3, RecomputationRegathersReleasedBlocksWithinMaxLive) {
  const int64_t block = 12704;  // one block of this GPT (n_embd 32: two layer norms, qkv, proj, fc, proj)
  const nlohmann::json partitioned = {
      {"zero_optimization",
       {{"stage3_param_persistence_threshold", 0},
        {"stage3_max_reuse_distance", 0},
        {"stage3_max_live_parameters", block}}}};
  auto plain = run(3, false, partitioned);
  deepspeed::checkpointing::reset_stats();
  auto checkpointed = run(3, true, partitioned);
  const auto s = deepspeed::checkpointing::stats();
  ASSERT_EQ(checkpointed.losses.size(), 6u);
  EXPECT_EQ(checkpointed.losses, plain.losses);
  EXPECT_EQ(dstest::max_weight_diff(checkpointed, plain), 0.0);
  // Every block's forward of every micro-step recomputed once: 2 ranks (threads of this
  // process) x 6 steps x 2 micro-batches x 3 blocks.
  EXPECT_EQ(s.recomputes, 2 * 6 * 2 * 3);
  for (int rank = 0; rank < 2; ++rank) {
    // Really partitioned (a block was gathered: with the default threshold the peak is 0), and
    // the recomputations' gathers stayed within stage3_max_live_parameters (one block).
    EXPECT_GE(checkpointed.memory[rank].peak_gathered_numel, block) << "rank " << rank;
    EXPECT_LE(checkpointed.memory[rank].peak_gathered_numel, block) << "rank " << rank;
    EXPECT_EQ(checkpointed.memory[rank].gathered_numel, 0) << "rank " << rank;
  }
}

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
