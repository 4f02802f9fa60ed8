// The memory report against the ZeRO paper's fp32 formulas (Ψ parameters, N ranks, Adam):
//   stage 0: 4Ψ weights + 4Ψ gradients + 8Ψ moments            = 16Ψ
//   stage 1: 4Ψ + 4Ψ + 8Ψ/N                                     = 8Ψ + 8Ψ/N
//   stage 2: 4Ψ + 4Ψ/N + 8Ψ/N                                   = 4Ψ + 12Ψ/N
//   stage 3: 4Ψ/N + 4Ψ/N + 8Ψ/N                                 = 16Ψ/N (+ the gathered working set,
//            reported apart: MemoryReport::gathered_bytes)
// In fp32 the rank's slice of the flat parameter buffer is the master copy, so no extra 4Ψ/N.
// Allowed slack: 5% (padding to 16·N elements is far below that); bucket buffers are reported
// separately as comm_buffers and must stay within the configured bucket sizes.
#include <gtest/gtest.h>

#include "support/training_run.h"

namespace zero_memory_test {

namespace {
double expected_bytes(int stage, double psi, int n) {
  switch (stage) {
    case 0: return 16 * psi;
    case 1: return 8 * psi + 8 * psi / n;
    case 2: return 4 * psi + 12 * psi / n;
    default: return 16 * psi / n;
  }
}
}  // namespace

class ZeroMemory : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(ZeroMemory, ModelStatesMatchTheFormula) {
  auto [world, stage] = GetParam();
  dstest::RunSpec s;
  s.world_size = world;
  s.steps = 2;
  s.config = dstest::base_config(2, 1, stage);
  const int64_t bucket = 2000;
  s.config["zero_optimization"]["reduce_bucket_size"] = bucket;
  auto r = dstest::train_gpt(s);
  const double psi = static_cast<double>(dstest::count_parameters(s.model));
  for (int rank = 0; rank < world; ++rank) {
    const auto& m = r.memory[rank];
    double want = expected_bytes(stage, psi, world);
    EXPECT_NEAR(m.model_states(), want, 0.05 * want)
        << "stage " << stage << " world " << world << " rank " << rank << ": params "
        << m.parameters << " grads " << m.gradients << " optimizer " << m.optimizer_states;
    // On the CPU every byte is host memory (tests/unit/stage_device_test: none on a device).
    EXPECT_EQ(m.host_bytes, m.total()) << "stage " << stage << " rank " << rank;
    EXPECT_EQ(m.device_bytes(), 0);
    if (stage == 2) {
      // Pool of equal-size bucket buffers: 2 in flight + 1 filling, each at most bucket + the
      // largest parameter (256 x 32 elements) of fp32.
      EXPECT_LE(m.comm_buffers, 3 * (bucket + 256 * 32) * 4);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formulas, ZeroMemory,
                         ::testing::Combine(::testing::Values(1, 2, 4), ::testing::Values(0, 1, 2, 3)));

TEST(ZeroMemory, Stage2AtMostTwoThirdsOfStage0AtTwoRanksAndUnderHalfAtFour) {
  for (auto [world, limit] : {std::pair{2, 0.66}, std::pair{4, 0.47}}) {
    std::vector<double> states;
    for (int stage : {0, 2}) {
      dstest::RunSpec s;
      s.world_size = world;
      s.steps = 1;
      s.config = dstest::base_config(1, 1, stage);
      states.push_back(dstest::train_gpt(s).memory[0].model_states());
    }
    EXPECT_LE(states[1] / states[0], limit) << "world " << world;
  }
}

TEST(ZeroFrozen, FrozenParameterIsNeverUpdatedAndTrainingMatchesStage0) {
  for (int stage : {0, 1, 2}) {
    dstest::RunSpec s;
    s.world_size = 2;
    s.steps = 5;
    s.frozen = {"wpe.weight"};
    s.config = dstest::base_config(2, 1, stage);
    auto r = dstest::train_gpt(s);
    dstest::RunSpec ref = s;
    ref.config = dstest::base_config(2, 1, 0);
    auto reference = dstest::train_gpt(ref);
    // wpe.weight is the second registered parameter.
    EXPECT_TRUE(torch::equal(r.weights[1], r.initial[1])) << "stage " << stage;
    EXPECT_LT(dstest::max_weight_diff(r, reference), 1e-4) << "stage " << stage;
  }
}

}  // namespace zero_memory_test
