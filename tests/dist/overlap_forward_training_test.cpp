// offload_optimizer.overlap_forward through the engine (zero/forward_waits.h): the test GPT,
// whose blocks are ZeroUnits, at stages 1 and 2 with CPU offload and the update during backward
// (overlap_step true: on this CPU build it is off by default). Each step is handed over to the
// next forward, and training is bit for bit the step that waits; a checkpoint saved right after
// a handed-over step holds the whole step and resumes exactly; where the key cannot apply (two
// data-parallel ranks, stage 3) it is ignored with a warning.
#include <gtest/gtest.h>

#include "deepspeed/deepspeed.h"
#include "deepspeed/pipe.h"
#include "gpt/model.h"
#include "runtime/engine_state.h"
#include "support/checkpoint_run.h"
#include "support/expect.h"
#include "support/pipeline_gpt.h"
#include "support/ranks.h"
#include "support/resume_alike.h"
#include "support/training_run.h"

namespace overlap_forward_training_test {

namespace {

nlohmann::json offload_config(int stage, bool bf16, bool overlap_forward) {
  nlohmann::json c = dstest::base_config(2, 2, stage);
  if (bf16) c["bf16"] = {{"enabled", true}};
  c["zero_optimization"]["offload_optimizer"] = {
      {"device", "cpu"}, {"overlap_step", true}, {"overlap_forward", overlap_forward}};
  return c;
}

}  // namespace

TEST(OverlapForwardTraining, TrainsAsTheWaitingStepAtStages1And2) {
  for (int stage : {1, 2}) {
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + (bf16 ? " bf16" : " fp32"));
      dstest::RunSpec s;
      s.steps = 5;
      s.config = offload_config(stage, bf16, false);
      auto waiting = dstest::train_gpt(s);
      s.config = offload_config(stage, bf16, true);
      bool handed_over = false, after_complete = true;
      s.after_training = [&](deepspeed::Engine& engine) {
        handed_over = deepspeed::state_of(engine).stage->step_handed_over();
        engine.complete_step();
        after_complete = deepspeed::state_of(engine).stage->step_handed_over();
      };
      auto handed = dstest::train_gpt(s);
      EXPECT_TRUE(handed_over) << "engine.step() waited for the whole update";
      EXPECT_FALSE(after_complete) << "engine.complete_step() left it running";
      ASSERT_EQ(handed.losses, waiting.losses);
      ASSERT_EQ(handed.weights.size(), waiting.weights.size());
      for (size_t i = 0; i < waiting.weights.size(); ++i)
        EXPECT_TRUE(torch::equal(handed.weights[i], waiting.weights[i])) << "parameter " << i;
    }
  }
}

// With activation checkpointing (the largest-model benchmark row's setting: every block recomputed
// in backward, its units' hooks running again there), handing the update over still trains bit for
// bit as the waiting step: the next backward completes the update before any recomputation.
TEST(OverlapForwardTraining, WithActivationCheckpointingTrainsAsTheWaitingStep) {
  dstest::RunSpec s;
  s.steps = 5;
  s.model.activation_checkpointing = true;
  s.config = offload_config(2, true, false);
  auto waiting = dstest::train_gpt(s);
  s.config = offload_config(2, true, true);
  bool handed_over = false;
  s.after_training = [&](deepspeed::Engine& engine) {
    handed_over = deepspeed::state_of(engine).stage->step_handed_over();
  };
  auto handed = dstest::train_gpt(s);
  EXPECT_TRUE(handed_over) << "engine.step() waited for the whole update";
  ASSERT_EQ(handed.losses, waiting.losses);
  ASSERT_EQ(handed.weights.size(), waiting.weights.size());
  for (size_t i = 0; i < waiting.weights.size(); ++i)
    EXPECT_TRUE(torch::equal(handed.weights[i], waiting.weights[i])) << "parameter " << i;
}

// save_checkpoint right after step() (the update may still be running) completes it first: the
// masters and both moments are the whole step's, and a job resumed from it (handing over again)
// continues exactly as one resumed from the waiting run's checkpoint.
TEST(OverlapForwardTraining, ACheckpointRightAfterAHandedOverStepHoldsTheWholeStep) {
  dstest::ResumeAlike spec;
  spec.config = [](bool overlap_forward) { return offload_config(2, true, overlap_forward); };
  spec.check_saved = [](const std::string& waiting_dir, const std::string& handed_dir) {
    auto a = dstest::consolidated_state(waiting_dir), b = dstest::consolidated_state(handed_dir);
    for (auto [x, y] : {std::pair{&a.fp32, &b.fp32}, {&a.exp_avg, &b.exp_avg},
                        {&a.exp_avg_sq, &b.exp_avg_sq}}) {
      ASSERT_EQ(x->size(), y->size());
      for (size_t i = 0; i < x->size(); ++i)
        EXPECT_TRUE(torch::equal((*x)[i].second, (*y)[i].second)) << (*x)[i].first;
    }
  };
  dstest::expect_resumed_alike(spec);
}

// Two data-parallel ranks all-gather the updated partitions at the step, and stage 3 gathers its
// units from the partition: the key is ignored there, said once, and each step completes itself.
TEST(OverlapForwardConfig, IgnoredWithAWarningWhereItCannotApply) {
  for (auto [stage, world] : {std::pair{2, 2}, {3, 1}}) {
    SCOPED_TRACE("stage " + std::to_string(stage) + ", " + std::to_string(world) + " ranks");
    dstest::RunSpec s;
    s.world_size = world;
    s.steps = 2;
    s.config = offload_config(stage, false, true);
    bool handed_over = true;
    s.after_training = [&](deepspeed::Engine& engine) {
      if (deepspeed::state_of(engine).comm->rank() == 0)
        handed_over = deepspeed::state_of(engine).stage->step_handed_over();
    };
    ::testing::internal::CaptureStderr();
    dstest::train_gpt(s);
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(dstest::occurrences(err, "overlap_forward"), 1u) << err;
    EXPECT_FALSE(handed_over);
  }
}

// A pipeline's stages run their forwards by its schedule: the key is ignored there too, said once.
TEST(OverlapForwardConfig, APipelineIgnoresItWithOneWarning) {
  ::testing::internal::CaptureStderr();
  dstest::run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto args = dstest::pipeline_args(comm, /*stages=*/2, /*zero_stage=*/1,
                                      dstest::tiny_pipeline_gpt(false));
    args.config_json["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"},
                                                                  {"overlap_forward", true}};
    deepspeed::pipe::initialize_pipeline(args);
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(dstest::occurrences(err, "overlap_forward is ignored"), 1u) << err;
}

}  // namespace overlap_forward_training_test
