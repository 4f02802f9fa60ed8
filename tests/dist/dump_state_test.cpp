// "dump_state": true prints the engine's composition and the config as read, once, on world
// rank 0, after initialize(); false (the default) prints nothing of it.
#include <gtest/gtest.h>

#include "gpt/model.h"
#include "support/expect.h"
#include "support/ranks.h"
#include "support/stage3_models.h"
#include "support/training_run.h"

namespace dump_state_test {

namespace {
// What the ranks (threads of this process) print to stdout while building an engine each.
std::string printed_by_initialize(bool dump_state, int stage) {
  auto config = dstest::base_config(2, 3, stage);
  config["dump_state"] = dump_state;
  testing::internal::CaptureStdout();
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto model = std::make_shared<gpt::GPTImpl>(gpt::GPTConfig{256, 16, 2, 2, 32});
    dstest::engine_over(model, config, comm);
  });
  return testing::internal::GetCapturedStdout();
}
}  // namespace

TEST(DumpState, PrintsTheEngineOnceOnRankZero) {
  const std::string out = printed_by_initialize(true, 3);
  EXPECT_EQ(dstest::occurrences(out, "[deepspeed] dump_state: the engine after initialize()"), 1u)
      << out;
  EXPECT_CONTAINS(out, "  world ........................ 2 = pipe 1 x data 2 x tensor 1\n");
  EXPECT_CONTAINS(out, "  zero_optimization.stage ...... 3\n");
  EXPECT_CONTAINS(out, "  train_batch_size ............. 12 = micro 2 x accumulation 3 x data 2\n");
  // Full sizes at stage 3, where the units' parameters are released.
  const int64_t params = dstest::count_parameters(gpt::GPTConfig{256, 16, 2, 2, 32});
  EXPECT_CONTAINS(out, "  trainable parameters ......... " + std::to_string(params) + " (");
  EXPECT_CONTAINS(out, "  master weights ............... Float\n");  // fp32 masters
  EXPECT_CONTAINS(out, "model states (MB)");
  EXPECT_CONTAINS(out, "\"dump_state\": true");  // the config as read
}

TEST(DumpState, OffByDefault) {
  EXPECT_EQ(printed_by_initialize(false, 2).find("dump_state: the engine"), std::string::npos);
}

}  // namespace dump_state_test
