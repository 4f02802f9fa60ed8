#include <gtest/gtest.h>

#include <torch/torch.h>

#include <string>

#include "deepspeed/engine.h"
#include "deepspeed/errors.h"
#include "deepspeed/memory.h"
#include "support/checkpoint_run.h"
#include "support/expect.h"
#include "support/training_run.h"
#include "util/allocation_meter.h"

namespace memory_estimate_test {

using deepspeed::estimate_zero_memory;

TEST(EstimateZeroMemory, Fp32Formulas) {
  const int64_t psi = 1000000;
  EXPECT_EQ(estimate_zero_memory(psi, 4, 0).model_states(), 16 * psi);
  EXPECT_EQ(estimate_zero_memory(psi, 4, 1).model_states(), 8 * psi + 8 * psi / 4);
  EXPECT_EQ(estimate_zero_memory(psi, 4, 2).model_states(), 4 * psi + 12 * psi / 4);
  EXPECT_EQ(estimate_zero_memory(psi, 4, 3).model_states(), 16 * psi / 4);
}

TEST(EstimateZeroMemory, MixedPrecisionFormulas) {
  const int64_t psi = 1000000;
  EXPECT_EQ(estimate_zero_memory(psi, 8, 0, true).model_states(), 16 * psi);
  EXPECT_EQ(estimate_zero_memory(psi, 8, 1, true).model_states(), 4 * psi + 12 * psi / 8);
  EXPECT_EQ(estimate_zero_memory(psi, 8, 2, true).model_states(), 2 * psi + 14 * psi / 8);
  EXPECT_EQ(estimate_zero_memory(psi, 8, 3, true).model_states(), 16 * psi / 8);
}

TEST(EstimateZeroMemory, TableListsEveryStageAndBadInputThrows) {
  auto table = deepspeed::format_zero_memory_estimates(3300000, 2);
  for (const char* row : {"    0 |", "    1 |", "    2 |", "    3 |"})
    EXPECT_NE(table.find(row), std::string::npos) << table;
  EXPECT_THROW(estimate_zero_memory(10, 0, 1), deepspeed::ConfigError);
  EXPECT_THROW(estimate_zero_memory(10, 2, 4), deepspeed::ConfigError);
}

// hpZ (ZeRO++): the secondary partition, 1/hpz of the weights in their dtype, at stage 3 only;
// the primary partitions are unchanged. 64 ranks in groups of 8 (one node each): 2Ψ/8 more in
// 16 bits, as the ZeRO++ paper counts it.
TEST(EstimateZeroMemory, HpzAddsTheSecondaryPartitionAtStage3) {
  const int64_t psi = 1000000;
  auto plain = estimate_zero_memory(psi, 64, 3, true);
  auto hpz = estimate_zero_memory(psi, 64, 3, true, 8);
  EXPECT_EQ(plain.hpz_secondary, 0);
  EXPECT_EQ(hpz.model_states(), plain.model_states());
  EXPECT_EQ(hpz.hpz_secondary, 2 * psi / 8);
  EXPECT_EQ(hpz.peak(), 16 * psi / 64 + 2 * psi / 8 + 4 * psi / 64);  // + the step's grad32
  EXPECT_EQ(estimate_zero_memory(psi, 4, 3, false, 2).hpz_secondary, 4 * psi / 2);  // fp32
  EXPECT_EQ(estimate_zero_memory(psi, 4, 3, true, 1).hpz_secondary, 0);   // hpz 1: none
  EXPECT_EQ(estimate_zero_memory(psi, 4, 2, true, 2).hpz_secondary, 0);   // stage 3 only
  EXPECT_EQ(estimate_zero_memory(psi, 4, 3, true, 16).hpz_secondary, 2 * psi / 4);  // = world
  EXPECT_THROW(estimate_zero_memory(psi, 6, 3, true, 4), deepspeed::ConfigError);
  EXPECT_THROW(estimate_zero_memory(psi, 4, 3, true, 0), deepspeed::ConfigError);
  try {
    estimate_zero_memory(psi, 6, 3, true, 4);
  } catch (const deepspeed::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("zero_hpz_partition_size 4"), std::string::npos) << e.what();
  }
  auto table = deepspeed::format_zero_memory_estimates(psi, 64, true, 8);
  EXPECT_NE(table.find("hpZ secondary"), std::string::npos) << table;
  EXPECT_NE(table.find("hpZ groups of 8"), std::string::npos) << table;
}

// Mixed precision: the step widens the gradient partition to fp32 (4Ψ/N; stage 0's one partition
// is all Ψ), which peak() counts and model_states() does not. With it stage 2's peak is DeepSpeed's
// estimate_zero2_model_states_mem_needs, 2Ψ + 18Ψ/N; fp32 steps the gradient itself.
TEST(EstimateZeroMemory, PeakCountsTheStepsFp32GradientCopy) {
  const int64_t psi = 1000000;
  for (int stage : {1, 2, 3}) {
    auto e = estimate_zero_memory(psi, 8, stage, true);
    EXPECT_EQ(e.step_transient, 4 * psi / 8) << "stage " << stage;
    EXPECT_EQ(e.peak(), e.model_states() + 4 * psi / 8) << "stage " << stage;
  }
  EXPECT_EQ(estimate_zero_memory(psi, 8, 0, true).step_transient, 4 * psi);
  EXPECT_EQ(estimate_zero_memory(psi, 8, 2, true).peak(), 2 * psi + 18 * psi / 8);
  for (int stage = 0; stage < 4; ++stage)
    EXPECT_EQ(estimate_zero_memory(psi, 8, stage, false).step_transient, 0) << "stage " << stage;
}

// Stage 3's largest layer gathered whole with its gradient: DeepSpeed's 4·largest_layer_params
// in 16 bits (8· in fp32); other stages hold every layer anyway. Stage 3's mixed-precision peak:
// 4L + 20Ψ/N (DeepSpeed's estimate_zero3 says 4L + 18Ψ/N: memory.h).
TEST(EstimateZeroMemory, Stage3PeakCountsTheLargestLayer) {
  const int64_t psi = 1000000, largest = 50000;
  auto e = estimate_zero_memory(psi, 8, 3, true, 1, largest);
  EXPECT_EQ(e.largest_layer_working, 4 * largest);
  EXPECT_EQ(e.peak(), 4 * largest + 20 * psi / 8);
  EXPECT_EQ(estimate_zero_memory(psi, 8, 3, false, 1, largest).largest_layer_working, 8 * largest);
  EXPECT_EQ(estimate_zero_memory(psi, 8, 2, true, 1, largest).largest_layer_working, 0);
  EXPECT_EQ(estimate_zero_memory(psi, 8, 3, true).largest_layer_working, 0);
  EXPECT_EQ(dstest::message_of<deepspeed::ConfigError>(
                [&] { estimate_zero_memory(psi, 8, 3, true, 1, psi + 1); }),
            "estimate_zero_memory: largest_layer_params 1000001 must be in 0..1000000 (the "
            "parameter count)");
  auto table = deepspeed::format_zero_memory_estimates(psi, 8, true, 1, largest);
  EXPECT_CONTAINS(table, "largest layer 50000");
}

// The table's MB is 2^20 bytes, as see_memory_usage's "model states (MB)". 2^20 fp32 parameters
// on one rank at stage 0: 4 MB of weights, 16 MB of model states (1e6-byte MB would print 4.2).
TEST(EstimateZeroMemory, TableMegabytesAreMebibytes) {
  auto table = deepspeed::format_zero_memory_estimates(int64_t{1} << 20, 1);
  EXPECT_CONTAINS(table, "MB = 2^20 bytes");
  EXPECT_CONTAINS(table, "      0 |             4.0 |            4.0 |            8.0 |"
                         "              16.0 |      16.0\n");
  auto mixed = deepspeed::format_zero_memory_estimates(int64_t{1} << 20, 1, true);
  // Mixed precision stage 0: 2 + 2 + 12 MB of model states, + the step's 4 MB fp32 gradients.
  EXPECT_CONTAINS(mixed, "      0 |             2.0 |            2.0 |           12.0 |"
                         "              16.0 |      20.0\n");
}

// What the step really allocates: one bf16 rank (N = 1) measured with the CPU allocation meter
// around step() after a first step made the moments. Its model states plus the step's transient
// must fit in peak(); model_states() alone (the estimate before step_transient) is short by 4Ψ.
// 1.7 M parameters: the gradient norm before the update widens 2^18-element chunks to double
// (zero/tensor_facts.cpp, 4 MiB at most), which a model under 1 M parameters would exceed 4Ψ by.
TEST(EstimateZeroMemory, PeakCoversWhatTheMixedPrecisionStepAllocates) {
  for (int stage : {1, 2}) {
    auto config = dstest::base_config(2, 1, stage);
    config["bf16"] = {{"enabled", true}};
    config["gradient_clipping"] = 0.0;
    config["steps_per_print"] = 0;
    const gpt::GPTConfig model{256, 16, 2, 2, 256};
    auto e = dstest::make_single_engine(config, model);
    e.train(1);
    auto batch = e.loader->next();
    e.engine->backward(e.engine->forward(batch.data, batch.target));
    const auto held = e.engine->memory_report();
    int64_t step_bytes = 0;
    {
      deepspeed::util::AllocationMeter meter;
      e.engine->step();
      step_bytes = meter.peak_bytes();
    }
    const int64_t psi = dstest::count_parameters(model);
    const auto est = estimate_zero_memory(psi, 1, stage, true);
    EXPECT_GE(step_bytes, est.step_transient) << "stage " << stage;
    EXPECT_LE(held.model_states() + step_bytes, est.peak() * 105 / 100)
        << "stage " << stage << ": held " << held.model_states() << ", step " << step_bytes
        << ", estimated peak " << est.peak();
  }
}

}  // namespace memory_estimate_test
