// The step's loss and gradient norm stay on the device unless the step needs them (issue 14: no
// host wait in a GPU step but fp16's overflow vote): read at the step with clipping or fp16,
// otherwise when asked (last_loss(), get_global_grad_norm(), the steps_per_print line, a
// monitor). Either way the figures are the same.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "deepspeed/engine.h"
#include "gpt/model.h"
#include "runtime/engine_state.h"
#include "support/training_run.h"

namespace step_figures_test {

namespace {

struct Figures {
  double loss, norm;
  bool pending_after_step;
};

// Two optimizer steps of a small GPT (bf16 at ZeRO `stage`), then the figures of the last one.
Figures train(int stage, double clipping, int steps_per_print) {
  torch::manual_seed(7);
  gpt::GPTConfig mc{256, 16, 2, 2, 64};
  auto model = std::make_shared<gpt::GPTImpl>(mc);
  auto config = dstest::base_config(2, 1, stage);
  config["bf16"] = {{"enabled", true}};
  config["steps_per_print"] = steps_per_print;
  if (clipping > 0) config["gradient_clipping"] = clipping;
  auto r = deepspeed::initialize<gpt::GPTImpl>({.model = model, .config_json = config});
  auto x = torch::randint(0, 256, {2, 16}, torch::kLong);
  testing::internal::CaptureStdout();
  for (int step = 0; step < 2; ++step) {
    r.engine->backward(r.engine->forward(x, x));
    r.engine->step();
  }
  testing::internal::GetCapturedStdout();
  auto& state = deepspeed::state_of(*r.engine);
  Figures f;
  f.pending_after_step = state.pending.scaled_norm.defined();
  f.loss = r.engine->last_loss();
  f.norm = r.engine->get_global_grad_norm();
  EXPECT_FALSE(state.pending.scaled_norm.defined()) << "asking settles them";
  return f;
}

TEST(StepFigures, UnreadUntilAskedWhenTheStepNeedsNoNorm) {
  for (int stage : {0, 1, 2, 3}) {
    // A clipping threshold no norm reaches: the step reads the norm, and clips nothing.
    const Figures read = train(stage, 1e9, 0);
    const Figures lazy = train(stage, 0.0, 0);
    EXPECT_FALSE(read.pending_after_step) << "stage " << stage << ": clipping reads the norm";
    EXPECT_TRUE(lazy.pending_after_step) << "stage " << stage;
    EXPECT_TRUE(std::isfinite(lazy.loss) && lazy.norm > 0) << "stage " << stage;
    EXPECT_EQ(lazy.loss, read.loss) << "stage " << stage;
    EXPECT_EQ(lazy.norm, read.norm) << "stage " << stage;
  }
}

TEST(StepFigures, ReadAtTheStepThatPrintsThem) {
  EXPECT_FALSE(train(2, 0.0, 1).pending_after_step);  // steps_per_print 1: every step's line
  EXPECT_FALSE(train(2, 0.0, 2).pending_after_step);  // the second step prints
  EXPECT_TRUE(train(2, 0.0, 3).pending_after_step);
}

}  // namespace

}  // namespace step_figures_test
