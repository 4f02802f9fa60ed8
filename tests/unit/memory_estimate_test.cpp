#include <gtest/gtest.h>

#include "deepspeed/errors.h"
#include "deepspeed/memory.h"

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
  EXPECT_EQ(hpz.peak(), 16 * psi / 64 + 2 * psi / 8);
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
