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
