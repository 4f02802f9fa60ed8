// ZeRO stage 1's gradients (zero/flat_grad_reducer.h): reduce-scattered into the rank's partition
// at the accumulation boundary only. The micro-steps before it accumulate in the parameters' .grad
// (autograd's), as DeepSpeed's stage 1 keeps them; the boundary's backward takes each sum into a
// bucket as it arrives, so after it (and between steps) no parameter holds a gradient and the rank
// keeps only its partition. On the wire: one reduce-scatter of the gradients per step (stage 2:
// one per micro-step), and no all-reduce of them.
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <string>

#include "support/training_run.h"

namespace stage1_gradients_test {
namespace {

dstest::RunSpec spec(int world, int stage, int accumulation) {
  dstest::RunSpec s;
  s.world_size = world;
  s.steps = 3;
  s.config = dstest::base_config(1, accumulation, stage);
  s.config["zero_optimization"]["reduce_bucket_size"] = 3000;  // several buckets
  return s;
}

// Rank 0's communicator statistics over the whole run.
deepspeed::comm::CommStats rank0_stats(dstest::RunSpec s) {
  std::mutex mu;
  deepspeed::comm::CommStats stats;
  s.after_training = [&](deepspeed::Engine& engine) {
    if (engine.communicator()->rank() != 0) return;
    std::lock_guard<std::mutex> lock(mu);
    stats = engine.communicator()->stats();
  };
  dstest::train_gpt(s);
  return stats;
}

int64_t bytes_of(const deepspeed::comm::CommStats& stats, const std::string& op) {
  auto it = stats.find(op);
  return it == stats.end() ? 0 : it->second.bytes;
}

}  // namespace

TEST(Stage1Gradients, ReduceScatteredOncePerStepNeverAllReduced) {
  const int accumulation = 3;
  const auto stage1 = rank0_stats(spec(2, 1, accumulation));
  const auto stage2 = rank0_stats(spec(2, 2, accumulation));
  const int64_t psi = dstest::count_parameters(dstest::RunSpec().model);
  const int64_t scattered = bytes_of(stage1, "reduce_scatter_v");
  // 3 steps of fp32 gradients, padded to the partitions' alignment.
  EXPECT_GE(scattered, 3 * 4 * psi);
  EXPECT_LE(scattered, 3 * 4 * psi * 101 / 100);
  EXPECT_EQ(bytes_of(stage2, "reduce_scatter_v"), accumulation * scattered);
  // The loss and the gradient norm's scalars only: not the gradients (stage 0/1 before: Ψ each).
  EXPECT_LT(bytes_of(stage1, "all_reduce"), 4 * psi / 100);
}

// The .grad of every trainable parameter: defined after a micro-step before the boundary (the
// accumulating sum), taken after the boundary's backward and never there between steps.
TEST(Stage1Gradients, GradsAccumulateBetweenMicroStepsAndAreTakenAtTheBoundary) {
  for (int world : {1, 2}) {
    SCOPED_TRACE("world " + std::to_string(world));
    dstest::RunSpec s = spec(world, 1, 3);
    std::mutex mu;
    std::map<std::string, int> seen;  // "<boundary> <defined>" -> parameters seen so
    auto look = [&](deepspeed::Engine& engine, const std::string& when) {
      std::lock_guard<std::mutex> lock(mu);
      for (const auto& p : engine.module().parameters())
        if (p.requires_grad()) ++seen[when + (p.grad().defined() ? " defined" : " undefined")];
    };
    s.step = [&](deepspeed::Engine& engine) {
      look(engine, engine.is_gradient_accumulation_boundary() ? "boundary" : "micro-step");
      engine.step();
    };
    s.after_training = [&](deepspeed::Engine& engine) { look(engine, "after"); };
    dstest::train_gpt(s);
    EXPECT_GT(seen["micro-step defined"], 0);
    EXPECT_EQ(seen["micro-step undefined"], 0);
    EXPECT_GT(seen["boundary undefined"], 0);
    EXPECT_EQ(seen["boundary defined"], 0);
    EXPECT_GT(seen["after undefined"], 0);
    EXPECT_EQ(seen["after defined"], 0);
  }
}

// The sum of the micro-steps reduced once trains as stage 0 (fp32: summation orders only), with
// and without accumulation, at world sizes 1 (no reduction: SingleRankGradients) and 2.
TEST(Stage1Gradients, TrainsAsStage0) {
  for (int world : {1, 2})
    for (int accumulation : {1, 3}) {
      SCOPED_TRACE("world " + std::to_string(world) + ", accumulation " +
                   std::to_string(accumulation));
      const auto stage0 = dstest::train_gpt(spec(world, 0, accumulation));
      const auto stage1 = dstest::train_gpt(spec(world, 1, accumulation));
      EXPECT_LT(dstest::max_loss_rel_diff(stage1, stage0), dstest::kLossTol);
      EXPECT_LT(dstest::max_weight_diff(stage1, stage0), dstest::kWeightTol);
      EXPECT_LT(dstest::max_grad_norm_rel_diff(stage1, stage0), dstest::kGradNormTol);
    }
}

}  // namespace stage1_gradients_test
