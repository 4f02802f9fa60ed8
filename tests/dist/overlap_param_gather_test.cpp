// zero_optimization.overlap_param_gather through the engine on two ranks over Gloo: the test GPT,
// whose blocks are ZeroUnits, at stages 1 and 2. engine.step() launches the all-gather of the
// updated partitions and returns; Engine::forward and each block settle their own chunks. The
// gather is cut into many chunks here (a small allgather_bucket_size), and a chunk reaches the
// buffer only when it is settled, so a forward that did not wait would read the last step's
// parameters: training is bit for bit the stage that waits for its gather. A checkpoint saved
// right after such a step holds the whole step; a pipeline ignores the key with one warning.
#include <gtest/gtest.h>

#include "deepspeed/deepspeed.h"
#include "deepspeed/pipe.h"
#include "runtime/engine_state.h"
#include "support/expect.h"
#include "support/pipeline_gpt.h"
#include "support/ranks.h"
#include "support/resume_alike.h"
#include "support/training_run.h"

namespace overlap_param_gather_test {

namespace {

nlohmann::json config(int stage, bool bf16, bool overlap, int accumulation = 1) {
  nlohmann::json c = dstest::base_config(2, accumulation, stage);
  if (bf16) c["bf16"] = {{"enabled", true}};
  c["zero_optimization"]["allgather_bucket_size"] = 2000;  // chunks of 1000 elements per rank
  c["zero_optimization"]["overlap_param_gather"] = overlap;
  return c;
}

void expect_same_training(const dstest::RunResult& a, const dstest::RunResult& b) {
  ASSERT_EQ(a.losses, b.losses);
  ASSERT_EQ(a.weights.size(), b.weights.size());
  for (size_t i = 0; i < b.weights.size(); ++i)
    EXPECT_TRUE(torch::equal(a.weights[i], b.weights[i])) << "parameter " << i;
}

}  // namespace

TEST(OverlapParamGather, TrainsAsTheWaitingGatherAtStages1And2) {
  struct Case {
    int stage;
    bool bf16;
    int accumulation;
  };
  for (const Case& k : {Case{1, false, 1}, Case{1, true, 2}, Case{2, false, 2}, Case{2, true, 1}}) {
    SCOPED_TRACE("stage " + std::to_string(k.stage) + (k.bf16 ? " bf16" : " fp32") + ", GAS " +
                 std::to_string(k.accumulation));
    dstest::RunSpec s;
    s.world_size = 2;
    s.steps = 4;
    s.config = config(k.stage, k.bf16, false, k.accumulation);
    const auto waiting = dstest::train_gpt(s);
    s.config = config(k.stage, k.bf16, true, k.accumulation);
    bool handed_over = false, after_complete = true;
    s.after_training = [&](deepspeed::Engine& engine) {
      const bool overlapped = deepspeed::state_of(engine).stage->step_handed_over();
      engine.complete_step();
      if (engine.communicator()->rank() != 0) return;
      handed_over = overlapped;
      after_complete = deepspeed::state_of(engine).stage->step_handed_over();
    };
    const auto overlapped = dstest::train_gpt(s);
    EXPECT_TRUE(handed_over) << "engine.step() waited for the whole gather";
    EXPECT_FALSE(after_complete) << "engine.complete_step() left it running";
    expect_same_training(overlapped, waiting);
  }
}

// save_checkpoint right after step() (the gather still in flight) completes it first, and a job
// resumed from it continues exactly as one resumed from the waiting run's checkpoint.
TEST(OverlapParamGather, ACheckpointRightAfterTheStepHoldsTheWholeStep) {
  dstest::ResumeAlike spec;
  spec.world_size = 2;
  spec.config = [](bool overlap) { return config(2, true, overlap); };
  dstest::expect_resumed_alike(spec);
}

// A pipeline's stages run their forwards by its schedule, not through Engine::forward.
TEST(OverlapParamGather, APipelineIgnoresItWithOneWarning) {
  ::testing::internal::CaptureStderr();
  dstest::run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto args = dstest::pipeline_args(comm, /*stages=*/2, /*zero_stage=*/1,
                                      dstest::tiny_pipeline_gpt(false));
    args.config_json["zero_optimization"]["overlap_param_gather"] = true;
    deepspeed::pipe::initialize_pipeline(args);
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(dstest::occurrences(err, "overlap_param_gather is ignored in a pipeline"), 1u) << err;
}

}  // namespace overlap_param_gather_test
