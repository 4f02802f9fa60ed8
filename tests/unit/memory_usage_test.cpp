// see_memory_usage-style lines: printed after the first optimizer step and on demand, with the
// model states of Engine::memory_report() and the process's resident memory.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <regex>

#include "deepspeed/device.h"
#include "deepspeed/engine.h"
#include "gpt/model.h"
#include "monitor/training_monitor.h"
#include "support/expect.h"
#include "support/training_run.h"

namespace memory_usage_test {

namespace {

double mb(int64_t bytes) { return std::round(bytes / 1048576.0 * 100) / 100; }

// "parameters 0.41 | gradients 0.41 | ..." -> the number after `what`.
double figure(const std::string& text, const std::string& what) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(what + " ([0-9.]+)")))
    throw std::runtime_error("no '" + what + "' in: " + text);
  return std::stod(m[1]);
}

TEST(MemoryUsage, FirstStepAndOnDemandLinesMatchTheMemoryReport) {
  gpt::GPTConfig mc{256, 16, 2, 2, 64};
  auto model = std::make_shared<gpt::GPTImpl>(mc);
  auto r = deepspeed::initialize<gpt::GPTImpl>(
      {.model = model, .config_json = dstest::base_config(2, 1, 1)});
  auto x = torch::randint(0, 256, {2, 16}, torch::kLong);
  testing::internal::CaptureStdout();
  for (int step = 0; step < 2; ++step) {
    r.engine->backward(r.engine->forward(x, x));
    r.engine->step();
  }
  const std::string printed = testing::internal::GetCapturedStdout();
  EXPECT_CONTAINS(printed, "[Rank 0] memory after step 1\n");
  EXPECT_EQ(printed.find("memory after step 2"), std::string::npos);  // once, not every step
  EXPECT_CONTAINS(printed, "CPU Virtual Memory:  used = ");

  testing::internal::CaptureStdout();
  const std::string text = r.engine->see_memory_usage("after two steps");
  EXPECT_EQ(testing::internal::GetCapturedStdout(), text);
  EXPECT_EQ(text.rfind("after two steps\n", 0), 0u);
  const auto rep = r.engine->memory_report();
  EXPECT_GT(rep.optimizer_states, 0);
  EXPECT_DOUBLE_EQ(figure(text, "parameters"), mb(rep.parameters));
  EXPECT_DOUBLE_EQ(figure(text, "gradients"), mb(rep.gradients));
  EXPECT_DOUBLE_EQ(figure(text, "optimizer states"), mb(rep.optimizer_states));
  EXPECT_DOUBLE_EQ(figure(text, "comm buffers"), mb(rep.comm_buffers));
  EXPECT_DOUBLE_EQ(figure(text, "\\| total"), mb(rep.total()));
  // The resident high-water mark is at least what is resident now, and holds the model states.
  const double rss = figure(text, "now"), peak = figure(text, "peak \\(VmHWM\\)");
  EXPECT_GE(peak, rss);
  EXPECT_GE(peak, mb(rep.model_states()));
  EXPECT_EQ(r.engine->see_memory_usage("not forced", /*force=*/false), "");
}

// As DeepSpeed's see_memory_usage, each report resets the GPU allocator's peaks: Max_MA is the
// peak since the previous report. GPU only (the CPU line has no resettable peak).
TEST(MemoryUsage, EachReportResetsTheGpuPeaks) {
  if (!deepspeed::cuda_available()) GTEST_SKIP() << "SKIPPED: no CUDA device";
  const c10::Device gpu(c10::kCUDA, 0);
  deepspeed::Config config;
  deepspeed::monitor::TrainingMonitor m(
      config, deepspeed::comm::make_single_process_communicator(), gpu, /*writer=*/true);
  {
    auto big = torch::empty({512LL << 20}, torch::TensorOptions().dtype(torch::kByte).device(gpu));
  }  // 0.5 GB allocated and freed
  testing::internal::CaptureStdout();
  const std::string first = m.see_memory_usage("first", /*print=*/true);
  const std::string second = m.see_memory_usage("second", /*print=*/true);
  testing::internal::GetCapturedStdout();
  EXPECT_GE(figure(first, "Max_MA"), 0.5) << first;
  EXPECT_LT(figure(second, "Max_MA"), 0.5) << second;
}

}  // namespace

}  // namespace memory_usage_test
