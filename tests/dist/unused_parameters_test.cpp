// zero_optimization.ignore_unused_parameters false (src/runtime/unused_parameters.h): a step in
// which a trainable parameter got no gradient from any backward since the last step fails on every
// rank, naming it, at ZeRO stages 1-3; a parameter used in one micro-step of the accumulation, a
// frozen one, stage 0 and the default (true) pass. Two ranks that disagree fail together.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <optional>
#include <string>

#include "deepspeed/engine.h"
#include "deepspeed/errors.h"
#include "support/expect.h"
#include "support/ranks.h"
#include "support/training_run.h"

namespace unused_parameters_test {

namespace {

// `spare` takes part in the loss only when forward is told so.
class TwoPathsImpl : public torch::nn::Module {
 public:
  TwoPathsImpl() {
    used = register_module("used", torch::nn::Linear(4, 4));
    spare = register_module("spare", torch::nn::Linear(4, 4));
  }
  torch::Tensor forward(const torch::Tensor& x, bool with_spare) {
    auto y = used->forward(x);
    if (with_spare) y = y + spare->forward(x);
    return y.pow(2).mean();
  }
  torch::nn::Linear used{nullptr}, spare{nullptr};
};
TORCH_MODULE(TwoPaths);

nlohmann::json config(int stage, int accumulation, std::optional<bool> ignore) {
  auto c = dstest::base_config(2, accumulation, stage);
  if (ignore) c["zero_optimization"]["ignore_unused_parameters"] = *ignore;
  return c;
}

struct TwoPathsRun {
  TwoPaths model;
  std::shared_ptr<deepspeed::ModelEngine<TwoPathsImpl>> engine;
  TwoPathsRun(deepspeed::comm::CommunicatorPtr comm, const nlohmann::json& config,
              bool freeze_spare) {
    torch::manual_seed(3);
    if (freeze_spare)
      for (auto& p : model->spare->parameters()) p.set_requires_grad(false);
    engine = deepspeed::initialize<TwoPathsImpl>(
                 {.model = model.ptr(), .config_json = config, .comm = comm})
                 .engine;
  }
  // One micro-step (an optimizer step at the end of its accumulation).
  void micro_step(bool with_spare) {
    engine->backward(engine->forward(torch::randn({2, 4}), with_spare));
    engine->step();
  }
};

std::string step_error(TwoPathsRun& run) {
  return dstest::message_of<deepspeed::ConfigError>([&] { run.engine->step(); });
}

}  // namespace

TEST(IgnoreUnusedParameters, FalseFailsTheStepNamingTheParameters) {
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    dstest::run_ranks(1, [&](deepspeed::comm::CommunicatorPtr comm) {
      TwoPathsRun run(comm, config(stage, 1, false), false);
      run.micro_step(true);  // both used: the step goes through
      EXPECT_EQ(run.engine->global_steps(), 1);
      const at::Tensor before = run.model->used->weight.detach().clone();
      run.engine->backward(run.engine->forward(torch::randn({2, 4}), false));
      const std::string msg = step_error(run);
      EXPECT_CONTAINS(msg, "zero_optimization.ignore_unused_parameters is false, and 2 trainable "
                           "parameters got no gradient from this step's backward passes: "
                           "spare.weight, spare.bias.");
      EXPECT_CONTAINS(msg, "set ignore_unused_parameters true");
      // Nothing of the step happened, and calling it again fails again.
      EXPECT_EQ(run.engine->global_steps(), 1);
      EXPECT_TRUE(torch::equal(run.model->used->weight.detach(), before));
      EXPECT_CONTAINS(step_error(run), "spare.weight, spare.bias");
    });
  }
}

// Used in one micro-step of two: the step's backward passes gave it a gradient.
TEST(IgnoreUnusedParameters, AParameterUsedInOneMicroStepPasses) {
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    dstest::run_ranks(1, [&](deepspeed::comm::CommunicatorPtr comm) {
      TwoPathsRun run(comm, config(stage, 2, false), false);
      for (int step = 0; step < 3; ++step) {
        run.micro_step(false);
        run.micro_step(true);
      }
      EXPECT_EQ(run.engine->global_steps(), 3);
    });
  }
}

// The default, stage 0 (DeepSpeed's engine without ZeRO takes no notice of the key) and a frozen
// unused parameter all train.
TEST(IgnoreUnusedParameters, DefaultStageZeroAndFrozenParametersPass) {
  struct Case {
    int stage;
    std::optional<bool> ignore;
    bool freeze;
  };
  for (const Case& c : {Case{2, std::nullopt, false}, Case{3, true, false}, Case{0, false, false},
                        Case{2, false, true}}) {
    SCOPED_TRACE("stage " + std::to_string(c.stage) + (c.freeze ? ", spare frozen" : ""));
    dstest::run_ranks(1, [&](deepspeed::comm::CommunicatorPtr comm) {
      TwoPathsRun run(comm, config(c.stage, 1, c.ignore), c.freeze);
      for (int step = 0; step < 2; ++step) run.micro_step(false);
      EXPECT_EQ(run.engine->global_steps(), 2);
    });
  }
}

// Rank 1 uses the parameter, rank 0 does not: both ranks fail the step together (DeepSpeed's
// assertion fires on rank 0 alone, and rank 1 waits in the step's collectives).
TEST(IgnoreUnusedParameters, RanksThatDisagreeFailTogether) {
  for (int stage : {2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    dstest::run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
      TwoPathsRun run(comm, config(stage, 1, false), false);
      run.engine->backward(run.engine->forward(torch::randn({2, 4}), comm->rank() == 1));
      const std::string msg = step_error(run);
      EXPECT_CONTAINS(msg, "(on at least one data-parallel rank): spare.weight, spare.bias");
      EXPECT_EQ(run.engine->global_steps(), 0);
    });
  }
}

}  // namespace unused_parameters_test
