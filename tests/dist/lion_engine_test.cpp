// "optimizer": {"type": "Lion"} through the engine, on ranks as threads (support/ranks.h):
//   - ZeRO stages 1-3, and stages 1-3 with optimizer offload to the CPU (DeepSpeedCPULion's
//     place), step as stage 0: Lion is element-wise, so a partition steps as the whole tensor;
//   - it trains the example GPT (the loss falls), in fp32 and bf16;
//   - its state is one fp32 momentum per element of the rank's partition (optimizer_states);
//   - a job saved at stage 2 resumes bit for bit from its checkpoint (libtorch's archive of the
//     state and options, as for every non-Adam optimizer), whatever options the resuming job has.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <mutex>

#include "optim/lion.h"
#include "support/files.h"
#include "support/training_run.h"

namespace lion_engine_test {

using nlohmann::json;

namespace {

constexpr int kSteps = 8;

json lion(double lr = 3e-3, double weight_decay = 0.1) {
  return {{"type", "Lion"},
          {"params", {{"lr", lr}, {"betas", {0.9, 0.99}}, {"weight_decay", weight_decay}}}};
}

dstest::RunSpec spec(int stage, const json& extra = json(), int steps = kSteps) {
  dstest::RunSpec s;
  s.world_size = 2;
  s.steps = steps;
  s.config = dstest::base_config(2, 1, stage);
  if (stage == 3) s.config["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
  s.config["optimizer"] = lion();
  if (!extra.is_null()) s.config.merge_patch(extra);
  return s;
}

// Elements of the two runs' weights more than kWeightTol apart (a NaN counts). Lion moves every
// weight by ±lr a step, so a last-bit difference in c near 0 (another summation order) flips a
// sign and puts one weight 2·lr from the reference: a few such are rounding; a partition stepped
// with another partition's state or gradient moves most of them.
int64_t weights_apart(const dstest::RunResult& a, const dstest::RunResult& b) {
  EXPECT_EQ(a.weights.size(), b.weights.size());
  int64_t n = 0;
  for (size_t i = 0; i < std::min(a.weights.size(), b.weights.size()); ++i)
    n += ((a.weights[i] - b.weights[i]).abs() <= dstest::kWeightTol)
             .logical_not()
             .sum()
             .item<int64_t>();
  return n;
}

}  // namespace

// Two ranks: stage 0's all-reduce and stages 1-3's reduce-scatter sum the same two gradients
// (a + b is one rounding either way); on this CPU the runs agree to the last bit. Asserted with
// room for a few signs flipped by other summation orders (weights_apart): at most one weight in
// a thousand apart, losses within 1e-4 relative.
TEST(LionEngine, StagesAndCpuOffloadStepAsStageZero) {
  const auto reference = dstest::train_gpt(spec(0));
  ASSERT_EQ(reference.losses.size(), size_t(kSteps));
  std::cout << "stage 0 loss " << reference.losses.front() << " -> " << reference.losses.back()
            << "\n";
  EXPECT_LT(reference.losses.back(), reference.losses.front() - 0.4);  // it trains
  const json offload = {{"zero_optimization", {{"offload_optimizer", {{"device", "cpu"}}}}}};
  for (int stage : {1, 2, 3})
    for (bool offloaded : {false, true}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + (offloaded ? " with CPU offload" : ""));
      const auto run = dstest::train_gpt(spec(stage, offloaded ? offload : json()));
      const int64_t psi = dstest::count_parameters(spec(stage).model);
      EXPECT_LT(dstest::max_loss_rel_diff(run, reference), 1e-4);
      EXPECT_LE(weights_apart(run, reference), psi / 1000);
    }
}

TEST(LionEngine, TrainsInBf16) {
  for (int stage : {0, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const auto run = dstest::train_gpt(spec(stage, {{"bf16", {{"enabled", true}}}}));
    std::cout << "bf16 stage " << stage << " loss " << run.losses.front() << " -> "
              << run.losses.back() << "\n";
    EXPECT_LT(run.losses.back(), run.losses.front() - 0.4);
  }
}

// One fp32 momentum per element the rank steps: the whole model at stage 0, about half of it
// (and padding) at stages 1-3 on two ranks. Adam would hold twice as much.
TEST(LionEngine, OneMomentumPerElementIsTheOptimizerState) {
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    auto s = spec(stage, json(), 2);
    std::vector<int64_t> held(2, -1);
    std::mutex mu;
    s.after_training = [&](deepspeed::Engine& e) {
      int64_t bytes = 0;
      for (auto& [key, state] : e.optimizer()->state())
        bytes += dynamic_cast<deepspeed::optim::LionParamState&>(*state).exp_avg().nbytes();
      std::lock_guard<std::mutex> lock(mu);
      held[e.communicator()->rank()] = bytes;
    };
    const auto r = dstest::train_gpt(s);
    const int64_t psi = dstest::count_parameters(s.model);
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(r.memory[rank].optimizer_states, held[rank]) << "rank " << rank;
      if (stage == 0) EXPECT_EQ(held[rank], 4 * psi) << "rank " << rank;
      if (stage > 0) EXPECT_NEAR(held[rank], 2 * psi, 0.05 * psi) << "rank " << rank;
    }
  }
}

// Saved after 4 of 8 steps at stage 2 and resumed by a job configured with another lr and
// weight decay: the checkpoint's options and momentum win, and the losses and weights are the
// uninterrupted run's bit for bit. Without the optimizer states the same resume trains otherwise.
TEST(LionEngine, ResumesBitForBitFromItsCheckpoint) {
  constexpr int kSaveAt = 4;
  const auto uninterrupted = dstest::train_gpt(spec(2));
  auto resume = [&](bool load_optimizer_states) {
    dstest::TempDir dir;
    auto saving = spec(2, json(), kSaveAt);
    saving.after_training = [&](deepspeed::Engine& e) { e.save_checkpoint(dir.path()); };
    dstest::train_gpt(saving);
    auto resuming = spec(2);  // trains on from the loaded step to kSteps
    resuming.config["optimizer"] = lion(1e-2, 0.3);
    resuming.model_seed = 11;  // other initial weights: the load must replace them
    resuming.before_training = [&](deepspeed::Engine& e) {
      e.load_checkpoint(dir.path(), "", true, load_optimizer_states);
    };
    return dstest::train_gpt(resuming);
  };
  const auto resumed = resume(true);
  const std::vector<double> tail(uninterrupted.losses.begin() + kSaveAt,
                                 uninterrupted.losses.end());
  EXPECT_EQ(resumed.losses, tail);
  EXPECT_EQ(dstest::max_weight_diff(resumed, uninterrupted), 0.0);
  EXPECT_NE(resume(false).losses, tail);
}

}  // namespace lion_engine_test
