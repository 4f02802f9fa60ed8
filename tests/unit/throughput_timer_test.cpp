// timers.throughput (DeepSpeed's ThroughputTimer): enabled (default true) gives the samples/s of
// rank 0's step line, false leaves it out; synchronized (default true) is carried into Config
// (on a CUDA device the printing step waits for the device first; no effect on the CPU).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/deepspeed.h"
#include "gpt/model.h"
#include "support/expect.h"
#include "support/training_run.h"

namespace throughput_timer_test {

namespace {
using nlohmann::json;

// Rank 0's step lines of two optimizer steps with steps_per_print 1.
std::string step_lines(const json& config) {
  torch::manual_seed(3);
  auto model = std::make_shared<gpt::GPTImpl>(gpt::GPTConfig{256, 16, 1, 2, 16});
  auto r = deepspeed::initialize<gpt::GPTImpl>({.model = model, .config_json = config});
  const auto x = torch::randint(0, 256, {2, 16}, torch::kLong);
  testing::internal::CaptureStdout();
  for (int i = 0; i < 2; ++i) {
    r.engine->backward(r.engine->forward(x, x));
    r.engine->step();
  }
  return testing::internal::GetCapturedStdout();
}

json printing_config() {
  json config = dstest::base_config(2, 1, 0);
  config["steps_per_print"] = 1;
  return config;
}
}  // namespace

TEST(ThroughputTimer, ConfigCarriesEnabledAndSynchronized) {
  const deepspeed::Config defaults = deepspeed::parse_config(printing_config(), 1);
  EXPECT_TRUE(defaults.throughput_timer.enabled);
  EXPECT_TRUE(defaults.throughput_timer.synchronized);
  json config = printing_config();
  config["timers"] = {{"throughput", {{"enabled", false}, {"synchronized", false}}}};
  const deepspeed::Config off = deepspeed::parse_config(config, 1);
  EXPECT_FALSE(off.throughput_timer.enabled);
  EXPECT_FALSE(off.throughput_timer.synchronized);
  // Still strict, as DeepSpeed's pydantic block.
  config["timers"]["throughput"]["enable"] = true;
  EXPECT_CONTAINS(dstest::message_of<deepspeed::ConfigError>(
                      [&] { deepspeed::parse_config(config, 1); }),
                  "timers.throughput.enable");
}

// The step line's samples/s is the throughput timer's figure: switched off, it is not printed
// (it used to be printed whatever the key said); the rest of the line stays.
TEST(ThroughputTimer, DisabledLeavesSamplesPerSecondOutOfTheStepLine) {
  const std::string on = step_lines(printing_config());
  EXPECT_CONTAINS(on, "[deepspeed] step=2 ");
  EXPECT_EQ(dstest::occurrences(on, "samples/s="), 2u) << on;

  json config = printing_config();
  config["timers"] = {{"throughput", {{"enabled", false}}}};
  const std::string off = step_lines(config);
  EXPECT_CONTAINS(off, "[deepspeed] step=1 ");
  EXPECT_CONTAINS(off, "[deepspeed] step=2 ");
  EXPECT_CONTAINS(off, "grad_norm=");
  EXPECT_EQ(off.find("samples/s"), std::string::npos) << off;
}

}  // namespace throughput_timer_test
