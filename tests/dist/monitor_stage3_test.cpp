// Monitoring under ZeRO-3 on 2 ranks, where each rank holds half of every parameter and gathers a
// block's parameters into new memory just before it runs. The flops profiler on rank 0 gives every
// module the MACs of a profile of the plain model, and the parameters at full size; the
// wall-clock line shows the gathers' time.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "deepspeed/engine.h"
#include "deepspeed/flops_profiler.h"
#include "gpt/model.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/flops_report.h"
#include "support/ranks.h"
#include "support/training_run.h"

namespace monitor_stage3_test {

namespace {
using deepspeed::profiling::FlopsProfiler;

TEST(FlopsProfilerStage3, TwoRanksCountTheWholeModelOnRankZero) {
  gpt::GPTConfig mc{256, 16, 2, 2, 32};
  auto x = torch::randint(0, 256, {2, 16}, torch::kLong);
  auto plain = std::make_shared<gpt::GPTImpl>(mc);
  FlopsProfiler prof(plain);
  prof.start_profile();
  plain->forward(x, x);
  prof.stop_profile();
  std::vector<std::string> expected;
  for (const auto& m : prof.modules())
    expected.push_back(deepspeed::profiling::macs_to_string(m.macs));

  dstest::TempDir dir;
  const std::string out = dir / "flops.txt";
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto model = std::make_shared<gpt::GPTImpl>(mc);
    auto config = dstest::base_config(2, 1, 3);
    config["flops_profiler"] = {{"enabled", true}, {"profile_step", 1}, {"output_file", out}};
    config["steps_per_print"] = 0;
    auto r =
        deepspeed::initialize<gpt::GPTImpl>({.model = model, .config_json = config, .comm = comm});
    for (int step = 0; step < 2; ++step) {
      r.engine->backward(r.engine->forward(x, x));
      r.engine->step();
    }
  });
  std::ifstream in(out);
  std::stringstream report;
  report << in.rdbuf();
  EXPECT_EQ(dstest::macs_column(report.str()), expected);
  EXPECT_CONTAINS(report.str(),
                  "world size:                                                             2");
  EXPECT_CONTAINS(report.str(),
                  "params per GPU:                                                         " +
                      deepspeed::profiling::params_to_string(plain->num_parameters()));
}

}  // namespace

namespace {
// wall_clock_breakdown under ZeRO-3 adds the parameter gathers' time to the per-step timer line.
TEST(WallClockStage3, GlobalLineShowsTheGatherTime) {
  gpt::GPTConfig mc{256, 16, 2, 2, 32};
  auto x = torch::randint(0, 256, {2, 16}, torch::kLong);
  testing::internal::CaptureStdout();
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto model = std::make_shared<gpt::GPTImpl>(mc);
    auto config = dstest::base_config(2, 1, 3);
    config["wall_clock_breakdown"] = true;
    config["steps_per_print"] = 2;
    auto r =
        deepspeed::initialize<gpt::GPTImpl>({.model = model, .config_json = config, .comm = comm});
    for (int step = 0; step < 2; ++step) {
      r.engine->backward(r.engine->forward(x, x));
      r.engine->step();
    }
  });
  const std::string out = testing::internal::GetCapturedStdout();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(\| step: [0-9.]+ \| gather: ([0-9.]+)\n)")))
      << out;
  EXPECT_GT(std::stod(m[1]), 0.0);  // every block is gathered in forward and again in backward
  // The per-micro-step line is DeepSpeed's, unchanged: it ends with step_microstep.
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(\| step_microstep: [0-9.]+\n)"))) << out;
}
}  // namespace

namespace {
// comms_logger.debug names each collective after the engine call it completed in (DeepSpeed's
// "[Caller Func: ...]"): stage 3 gathers in forward and backward, reduce-scatters gradients in
// backward, averages the loss in step.
TEST(CommsLoggerDebug, TableNamesTheEngineCall) {
  gpt::GPTConfig mc{256, 16, 2, 2, 32};
  auto x = torch::randint(0, 256, {2, 16}, torch::kLong);
  std::string table;
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto model = std::make_shared<gpt::GPTImpl>(mc);
    auto config = dstest::base_config(2, 1, 3);
    config["comms_logger"] = {{"enabled", true}, {"debug", true}};
    config["steps_per_print"] = 0;
    auto r =
        deepspeed::initialize<gpt::GPTImpl>({.model = model, .config_json = config, .comm = comm});
    r.engine->backward(r.engine->forward(x, x));
    r.engine->step();
    const std::string t = r.engine->comms_summary();  // rank 0 also prints it
    if (comm->rank() == 0) table = t;
  });
  EXPECT_CONTAINS(table, "all_reduce | [Caller Func: step]");  // the loss mean
  EXPECT_CONTAINS(table, "reduce_scatter_v | [Caller Func: bwd");  // gradients, in backward
  // (Rows without a caller are possible here, not in a real run: ranks are threads of one
  // process, and the process-wide observer also sees rank 1's collectives, which may complete
  // while rank 0 is between engine calls.)
}
}  // namespace

}  // namespace monitor_stage3_test
