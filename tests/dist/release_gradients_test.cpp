// zero_optimization.release_gradients (deepspeed.cpp's own key; on by default on a GPU): the
// gradient partition of stages 2 and 3 is freed after each step and allocated again when the next
// backward's first reduced gradient arrives, so it does not sit beside the next forward's
// activations (DeepSpeed's _release_ipg_buffers frees grads_in_partition the same way). Training
// must not change by a bit: the same arithmetic lands in a fresh buffer (zeros; at data-parallel
// world size 1 uninitialized, with the gaps between parameters zeroed, which gradient clipping's
// norm over the whole partition would see). And the memory must really be gone after the step.
#include <gtest/gtest.h>

#include <functional>
#include <iostream>
#include <string>

#include "support/expect.h"
#include "support/training_run.h"
#include "util/allocation_meter.h"

namespace release_gradients_test {

// Outside the anonymous namespace: the fixture's base names it (this file's namespace keeps it
// apart in a unity batch; -Wsubobject-linkage).
struct Case {
  int world;
  int stage;
  int accumulation;
  bool bf16;
};

namespace {

std::string name_of(const Case& c) {
  return "w" + std::to_string(c.world) + "_stage" + std::to_string(c.stage) + "_gas" +
         std::to_string(c.accumulation) + (c.bf16 ? "_bf16" : "_fp32");
}

dstest::RunResult train(const Case& c, bool release,
                        std::function<void(deepspeed::Engine&)> after = {},
                        const gpt::GPTConfig& model = dstest::RunSpec().model) {
  dstest::RunSpec s;
  s.model = model;
  s.world_size = c.world;
  s.steps = 4;
  s.config = dstest::base_config(2, c.accumulation, c.stage);
  s.config["gradient_clipping"] = 0.05;  // the norm of the whole partition decides every step
  s.config["zero_optimization"]["release_gradients"] = release;
  // Every parameter in a unit, so stage 3's partition holds them all.
  if (c.stage == 3) s.config["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
  if (c.bf16) s.config["bf16"] = {{"enabled", true}};
  s.after_training = std::move(after);
  return dstest::train_gpt(s);
}

}  // namespace

class ReleaseGradients : public ::testing::TestWithParam<Case> {};

TEST_P(ReleaseGradients, TrainsBitForBitAsAPartitionKept) {
  const Case c = GetParam();
  const dstest::RunResult kept = train(c, false), released = train(c, true);
  EXPECT_TRUE(dstest::bit_identical(released.weights, kept.weights));
  EXPECT_EQ(released.losses, kept.losses);
  EXPECT_EQ(released.grad_norms, kept.grad_norms);
  ASSERT_EQ(released.memory.size(), kept.memory.size());
  // The memory report counts the partition as the step holds it, released or not.
  EXPECT_EQ(released.memory[0].gradients, kept.memory[0].gradients);
  EXPECT_GT(released.memory[0].gradients, 0);
}

// World size 1 at stage 2 is SingleRankGradients (no bucket; the partition is written, not added
// to, on the first micro-step); above it ReduceScatterBuckets; stage 3 its unit partition.
INSTANTIATE_TEST_SUITE_P(Stages, ReleaseGradients,
                         ::testing::Values(Case{1, 2, 1, false}, Case{1, 2, 3, false},
                                           Case{1, 2, 2, true}, Case{2, 2, 2, false},
                                           Case{2, 3, 2, false}, Case{1, 3, 1, true}),
                         [](const auto& info) { return name_of(info.param); });

// After the step, the bytes libtorch holds on the CPU are lower with the key than without by the
// partition, and at stage 2 with peers by the bucket pool too: freed, not zeroed (the rest of the
// two runs is the same). Ranks are threads of this process: every rank's bytes count, read by
// rank 0 between two barriers, when every rank has finished its last step and none has gone on.
TEST(ReleaseGradients, ThePartitionIsFreedAfterTheStep) {
  for (const Case c : {Case{1, 2, 1, false}, Case{1, 3, 1, false}, Case{2, 2, 1, false}}) {
    SCOPED_TRACE(name_of(c));
    int64_t held[2] = {0, 0};
    int64_t freed = 0;
    for (bool release : {false, true}) {
      deepspeed::util::AllocationMeter meter;
      const dstest::RunResult r = train(c, release, [&](deepspeed::Engine& e) {
        e.communicator()->barrier();
        if (e.communicator()->rank() == 0) held[release] = meter.current_bytes();
        e.communicator()->barrier();
      });
      freed = 0;
      for (const auto& m : r.memory) freed += m.gradients + (c.stage == 2 ? m.comm_buffers : 0);
    }
    EXPECT_EQ(held[0] - held[1], freed) << "held without the key " << held[0] << ", with it "
                                        << held[1] << "; the partitions (and bucket pools) "
                                        << freed;
  }
}

// What the key is for: the partition is not held through the forward, so a step's peak falls by
// it. The model has the GPU benchmark's proportions where they matter (tied head, vocabulary 50304:
// the logits, their log-softmax and their gradient outweigh the partition and are gone before
// backward's first parameter gradient arrives, where the partition is allocated again).
TEST(ReleaseGradients, AStepsPeakFallsByThePartition) {
  gpt::GPTConfig model{50304, 64, 2, 2, 64};
  model.bias = false;
  model.tie_embeddings = true;
  for (int stage : {2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    int64_t peak[2] = {0, 0};
    int64_t partition = 0;
    for (bool release : {false, true}) {
      deepspeed::util::AllocationMeter meter;
      const dstest::RunResult r = train(
          {1, stage, 1, false}, release,
          [&](deepspeed::Engine&) { peak[release] = meter.peak_bytes(); }, model);
      partition = r.memory[0].gradients;
    }
    std::cout << "stage " << stage << ": peak " << peak[0] << " bytes with the partition kept, "
              << peak[1] << " released; the partition " << partition << std::endl;
    EXPECT_LE(peak[1], peak[0] - partition * 9 / 10);
  }
}

}  // namespace release_gradients_test
