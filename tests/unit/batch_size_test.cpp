// Batch-size resolution: train_batch_size = micro-batch * accumulation steps * DP world size.
// Every given/derived combination, the errors, and "auto" / initialize() overrides.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "deepspeed/config.h"
#include "deepspeed/errors.h"
#include "support/expect.h"

namespace deepspeed {
namespace batch_size_test {

using nlohmann::json;

BatchSizes sizes(int64_t tbs, int64_t mbs, int64_t gas) {
  BatchSizes b;
  b.train_batch_size = tbs;
  b.train_micro_batch_size_per_gpu = mbs;
  b.gradient_accumulation_steps = gas;
  return b;
}

std::string resolve_error(BatchSizes given, int dp) {
  try {
    resolve_batch_sizes(given, dp);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError";
  return "";
}

struct Case {
  BatchSizes given;
  int dp;
  BatchSizes expected;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "given (" << c.given.train_batch_size << ", " << c.given.train_micro_batch_size_per_gpu
      << ", " << c.given.gradient_accumulation_steps << ") dp " << c.dp;
}

class ResolveBatchSizes : public ::testing::TestWithParam<Case> {};

TEST_P(ResolveBatchSizes, DerivesTheMissingValues) {
  const Case& c = GetParam();
  BatchSizes r = resolve_batch_sizes(c.given, c.dp);
  EXPECT_EQ(r.train_batch_size, c.expected.train_batch_size);
  EXPECT_EQ(r.train_micro_batch_size_per_gpu, c.expected.train_micro_batch_size_per_gpu);
  EXPECT_EQ(r.gradient_accumulation_steps, c.expected.gradient_accumulation_steps);
}

INSTANTIATE_TEST_SUITE_P(
    AllCombinations, ResolveBatchSizes,
    ::testing::Values(Case{sizes(32, 4, 2), 4, sizes(32, 4, 2)},  // all three: only checked
                      Case{sizes(32, 4, 0), 4, sizes(32, 4, 2)},  // TBS, MBS -> GAS
                      Case{sizes(32, 0, 2), 4, sizes(32, 4, 2)},  // TBS, GAS -> MBS
                      Case{sizes(0, 4, 2), 4, sizes(32, 4, 2)},   // MBS, GAS -> TBS
                      Case{sizes(32, 0, 0), 4, sizes(32, 8, 1)},  // TBS only -> GAS 1
                      Case{sizes(0, 4, 0), 4, sizes(16, 4, 1)},   // MBS only -> GAS 1
                      Case{sizes(7, 0, 0), 1, sizes(7, 7, 1)},    // world size 1
                      Case{sizes(21, 7, 0), 3, sizes(21, 7, 1)},  // primes
                      Case{sizes(30, 0, 5), 3, sizes(30, 2, 5)}));

// Every world size 1..4 with every way of giving two of the three values.
TEST(ResolveBatchSizesSweep, AnyTwoGiveTheThird) {
  for (int dp = 1; dp <= 4; ++dp) {
    for (int64_t mbs : {1, 3, 8}) {
      for (int64_t gas : {1, 2, 5}) {
        const int64_t tbs = mbs * gas * dp;
        for (BatchSizes given :
             {sizes(tbs, mbs, 0), sizes(tbs, 0, gas), sizes(0, mbs, gas), sizes(tbs, mbs, gas)}) {
          BatchSizes r = resolve_batch_sizes(given, dp);
          EXPECT_EQ(r.train_batch_size, tbs) << dp << " " << mbs << " " << gas;
          EXPECT_EQ(r.train_micro_batch_size_per_gpu, mbs);
          EXPECT_EQ(r.gradient_accumulation_steps, gas);
        }
      }
    }
  }
}

TEST(ResolveBatchSizesErrors, InconsistentTriplePrintsAllValuesAndWorldSize) {
  std::string msg = resolve_error(sizes(16, 3, 2), 2);
  EXPECT_CONTAINS(msg,
                  "train_batch_size (16) != train_micro_batch_size_per_gpu (3) * "
                  "gradient_accumulation_steps (2) * world size (2)");
}

TEST(ResolveBatchSizesErrors, NonDivisibleTbsByMbsTimesDp) {
  // DeepSpeed would floor 16 // 3 // 2 = 2 and then fail its assertion; we say why directly.
  std::string msg = resolve_error(sizes(16, 3, 0), 2);
  EXPECT_CONTAINS(msg, "train_batch_size (16) is not a positive multiple of");
  EXPECT_CONTAINS(msg, "(6)");
  EXPECT_CONTAINS(msg, "train_micro_batch_size_per_gpu (3)");
  EXPECT_CONTAINS(msg, "gradient_accumulation_steps (not given)");
  EXPECT_CONTAINS(msg, "world size (2)");
}

TEST(ResolveBatchSizesErrors, NonDivisibleTbsByGasTimesDp) {
  std::string msg = resolve_error(sizes(10, 0, 3), 2);
  EXPECT_CONTAINS(msg, "train_micro_batch_size_per_gpu cannot be derived");
}

TEST(ResolveBatchSizesErrors, TbsOnlyNotDivisibleByWorldSize) {
  EXPECT_CONTAINS(resolve_error(sizes(6, 0, 0), 4), "train_batch_size (6)");
  EXPECT_CONTAINS(resolve_error(sizes(2, 0, 0), 4), "world size (4)");  // TBS < DP
}

TEST(ResolveBatchSizesErrors, NoneOrOnlyAccumulationSteps) {
  EXPECT_CONTAINS(resolve_error(sizes(0, 0, 0), 1),
                  "either train_batch_size or train_micro_batch_size_per_gpu must be given");
  EXPECT_CONTAINS(resolve_error(sizes(0, 0, 4), 2), "must be given");
}

TEST(ResolveBatchSizesErrors, NegativeValuesAndBadWorldSize) {
  EXPECT_CONTAINS(resolve_error(sizes(-8, 0, 0), 1), "positive");
  EXPECT_CONTAINS(resolve_error(sizes(8, 0, 0), 0), "world size 0");
}

// ---- through parse_config: value forms, "auto" and initialize() overrides ---------------------

ConfigOverrides overrides(std::optional<int64_t> tbs, std::optional<int64_t> mbs,
                          std::optional<int64_t> gas) {
  ConfigOverrides o;
  o.train_batch_size = tbs;
  o.train_micro_batch_size_per_gpu = mbs;
  o.gradient_accumulation_steps = gas;
  return o;
}

std::string parse_error(const json& doc, int dp, const ConfigOverrides& o = {}) {
  try {
    parse_config(doc, dp, o);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError for " << doc.dump();
  return "";
}

TEST(BatchKeys, ValueFormsAccepted) {
  Config c =
      parse_config(json{{"train_batch_size", "3.2e1"}, {"gradient_accumulation_steps", 2.0}}, 4);
  EXPECT_EQ(c.train_batch_size, 32);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
}

TEST(BatchKeys, ZeroOrFractionRejected) {
  EXPECT_CONTAINS(parse_error(json{{"train_batch_size", 0}}, 1),
                  "'train_batch_size' has value 0; expected a positive integer");
  EXPECT_CONTAINS(parse_error(json{{"train_micro_batch_size_per_gpu", 2.5}}, 1),
                  "'train_micro_batch_size_per_gpu' has value 2.5");
}

TEST(BatchKeys, AutoResolvedByOverride) {
  json doc = {{"train_batch_size", "auto"},
              {"train_micro_batch_size_per_gpu", "auto"},
              {"gradient_accumulation_steps", 1}};
  Config c = parse_config(doc, 2, overrides(std::nullopt, 8, std::nullopt));
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 8);
  EXPECT_EQ(c.train_batch_size, 16);
  EXPECT_EQ(c.raw["train_batch_size"], 16);
  EXPECT_EQ(c.raw["train_micro_batch_size_per_gpu"], 8);
}

TEST(BatchKeys, AutoWithoutAnyValueIsAnErrorThatSaysSo) {
  json doc = {{"train_batch_size", "auto"}, {"train_micro_batch_size_per_gpu", "auto"}};
  std::string msg = parse_error(doc, 1);
  EXPECT_CONTAINS(msg, "\"auto\" (train_batch_size, train_micro_batch_size_per_gpu)");
  EXPECT_CONTAINS(msg, "initialize()");
}

TEST(BatchKeys, ExplicitValueDisagreeingWithOverrideIsAnError) {
  json doc = {{"train_micro_batch_size_per_gpu", 4}};
  std::string msg = parse_error(doc, 1, overrides(std::nullopt, 8, std::nullopt));
  EXPECT_CONTAINS(msg, "'train_micro_batch_size_per_gpu' is 4");
  EXPECT_CONTAINS(msg, "given train_micro_batch_size_per_gpu = 8");
}

TEST(BatchKeys, ExplicitValueAgreeingWithOverrideIsFine) {
  json doc = {{"train_micro_batch_size_per_gpu", 4}, {"gradient_accumulation_steps", 2}};
  Config c = parse_config(doc, 3, overrides(24, 4, std::nullopt));
  EXPECT_EQ(c.train_batch_size, 24);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
}

TEST(BatchKeys, OverrideFillsAnAbsentKey) {
  Config c = parse_config(json{{"gradient_accumulation_steps", 4}}, 2,
                          overrides(std::nullopt, 3, std::nullopt));
  EXPECT_EQ(c.train_batch_size, 24);
}

TEST(BatchKeys, OverrideMakingTheTripleInconsistentIsAnError) {
  json doc = {{"train_batch_size", 16},
              {"train_micro_batch_size_per_gpu", "auto"},
              {"gradient_accumulation_steps", 2}};
  EXPECT_CONTAINS(parse_error(doc, 2, overrides(std::nullopt, 3, std::nullopt)),
                  "train_batch_size (16) != train_micro_batch_size_per_gpu (3) * "
                  "gradient_accumulation_steps (2) * world size (2)");
}

TEST(BatchKeys, NonPositiveOverrideIsAnError) {
  EXPECT_CONTAINS(
      parse_error(json{{"train_batch_size", 8}}, 1, overrides(std::nullopt, 0, std::nullopt)),
      "initialize() was given train_micro_batch_size_per_gpu = 0");
}

}  // namespace batch_size_test
}  // namespace deepspeed
