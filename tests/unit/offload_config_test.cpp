// offload_param / offload_optimizer keys read as DeepSpeed's pydantic models read them: a block
// DeepSpeed ignores at this stage (offload_param below stage 3, any offload at stage 0) is
// accepted with a warning even when it would be incomplete where used (nvme without nvme_path),
// and buffer_count takes DeepSpeed's range (>= 0).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "deepspeed/config.h"
#include "deepspeed/errors.h"
#include "support/expect.h"

namespace offload_config_test {

using nlohmann::json;

namespace {

json with_zero(const json& zero) { return {{"train_batch_size", 8}, {"zero_optimization", zero}}; }

bool any_contains(const std::vector<std::string>& v, const std::string& needle) {
  for (const auto& s : v)
    if (s.find(needle) != std::string::npos) return true;
  return false;
}

}  // namespace

// Before, nvme without nvme_path was refused while reading the block, at any stage.
TEST(OffloadConfig, NvmeWithoutPathIsAcceptedWhereTheBlockIsIgnored) {
  for (int stage : {0, 1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    std::vector<std::string> warnings;
    const auto c = deepspeed::parse_config(
        with_zero({{"stage", stage}, {"offload_param", {{"device", "nvme"}}}}), 1, {}, &warnings);
    EXPECT_EQ(c.zero_optimization.offload_param.device, "none");
    EXPECT_TRUE(any_contains(warnings, "zero_optimization.offload_param applies to stage 3 only"));
  }
  std::vector<std::string> warnings;
  const auto c = deepspeed::parse_config(
      with_zero({{"stage", 0}, {"offload_optimizer", {{"device", "nvme"}}}}), 1, {}, &warnings);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, "none");
  EXPECT_TRUE(any_contains(warnings, "offload_optimizer needs ZeRO stage 1, 2 or 3"));
}

TEST(OffloadConfig, NvmeWithoutPathIsRefusedWhereUsed) {
  auto error = [](const json& zero) {
    return dstest::message_of<deepspeed::ConfigError>(
        [&] { deepspeed::parse_config(with_zero(zero), 1, {}, nullptr); });
  };
  EXPECT_CONTAINS(error({{"stage", 3}, {"offload_param", {{"device", "nvme"}}}}),
                  "'zero_optimization.offload_param.nvme_path' is not set");
  for (int stage : {1, 2, 3})
    EXPECT_CONTAINS(error({{"stage", stage}, {"offload_optimizer", {{"device", "nvme"}}}}),
                    "'zero_optimization.offload_optimizer.nvme_path' is not set");
}

// DeepSpeed: buffer_count Field(ge=0) in both blocks. A store that swaps refuses 0 itself
// (ParamStoreErrors.BufferCountZeroOnlyWhenUnitsAreSwapped).
TEST(OffloadConfig, BufferCountZeroIsAccepted) {
  const auto c = deepspeed::parse_config(
      with_zero({{"stage", 3},
                 {"offload_param", {{"device", "cpu"}, {"buffer_count", 0}}},
                 {"offload_optimizer", {{"device", "cpu"}, {"buffer_count", 0}}}}),
      1, {}, nullptr);
  EXPECT_EQ(c.zero_optimization.offload_param.buffer_count, 0);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.buffer_count, 0);
  EXPECT_CONTAINS(dstest::message_of<deepspeed::ConfigError>([] {
                    deepspeed::parse_config(
                        with_zero({{"stage", 3}, {"offload_param", {{"buffer_count", -1}}}}), 1, {},
                        nullptr);
                  }),
                  "zero_optimization.offload_param.buffer_count");
}

}  // namespace offload_config_test
