// The config's warnings in a job of several ranks: printed once, by global rank 0, as DeepSpeed
// logs its config messages (log_dist ranks=[0]), not once per rank; an error in the config is
// still thrown on every rank. Ranks run as threads, so stderr is the job's.
#include <gtest/gtest.h>

#include <mutex>

#include "deepspeed/deepspeed.h"
#include "deepspeed/pipe.h"
#include "gpt/pipeline_model.h"
#include "support/expect.h"
#include "support/pipeline_gpt.h"
#include "support/ranks.h"
#include "support/training_run.h"

namespace config_ranks_test {

namespace {

const char* const kWarning = "unknown config key 'gradient_cliping'";

std::shared_ptr<gpt::GPTImpl> tiny_gpt() {
  static std::mutex mu;  // module construction draws from the global generator
  std::lock_guard<std::mutex> lock(mu);
  return std::make_shared<gpt::GPTImpl>(gpt::GPTConfig{256, 16, 1, 2, 16});
}

}  // namespace

TEST(ConfigRanks, AWarningIsPrintedOnceNotOncePerRank) {
  auto config = dstest::base_config(1, 1, 0);
  config["gradient_cliping"] = 1.0;
  ::testing::internal::CaptureStderr();
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    deepspeed::initialize<gpt::GPTImpl>(
        {.model = tiny_gpt(), .config_json = config, .comm = comm, .device = "cpu"});
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(dstest::occurrences(err, kWarning), 1u) << err;
}

// Under tensor parallelism the engine's communicator is a data-parallel group, of which every
// tensor rank has a rank 0: still the one global rank 0 prints.
TEST(ConfigRanks, ATensorParallelJobPrintsItOnce) {
  auto config = dstest::base_config(1, 1, 0);
  config["gradient_cliping"] = 1.0;
  ::testing::internal::CaptureStderr();
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto topology =
        std::make_shared<deepspeed::comm::Topology>(comm, deepspeed::comm::TopologySizes{1, 2});
    deepspeed::initialize<gpt::GPTImpl>(
        {.model = tiny_gpt(), .config_json = config, .device = "cpu", .topology = topology});
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(dstest::occurrences(err, kWarning), 1u) << err;
}

// Each pipeline stage builds its engine over its own data-parallel group, whose rank 0 is not
// the job's: one stage's prints.
TEST(ConfigRanks, APipelinePrintsItOnce) {
  ::testing::internal::CaptureStderr();
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto args = dstest::pipeline_args(comm, /*stages=*/2, /*zero_stage=*/0,
                                      dstest::tiny_pipeline_gpt(false));
    args.config_json["gradient_cliping"] = 1.0;
    deepspeed::pipe::initialize_pipeline(args);
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(dstest::occurrences(err, kWarning), 1u) << err;
}

// A pipeline's micro-batches before the last accumulate in the parameters' .grad at every ZeRO
// stage, so a wider data_types.grad_accum_dtype is warned about (once) at stages 0, 1 and 2;
// at stage 2 the partition stays in the model's dtype (it gets one reduce-scatter of a 16-bit
// sum per batch: an fp32 partition would cost twice the bytes for nothing). Stage 2 printed
// nothing and kept an fp32 partition before.
TEST(ConfigRanks, APipelinesWiderGradAccumDtypeIsWarnedAtEveryZeroStage) {
  for (int stage : {0, 1, 2}) {
    std::vector<int64_t> gradient_bytes(2, 0);
    for (bool wider : {false, true}) {
      ::testing::internal::CaptureStderr();
      std::mutex mu;
      run_ranks(4, [&](deepspeed::comm::CommunicatorPtr comm) {
        auto args = dstest::pipeline_args(comm, /*stages=*/2, stage,
                                          dstest::tiny_pipeline_gpt(false));
        args.config_json["bf16"] = {{"enabled", true}};
        if (wider) args.config_json["data_types"] = {{"grad_accum_dtype", "fp32"}};
        auto engine = deepspeed::pipe::initialize_pipeline(args);
        if (comm->rank() == 0) {
          std::lock_guard<std::mutex> lock(mu);
          gradient_bytes[wider] = engine->memory_report().gradients;
        }
      });
      const std::string err = ::testing::internal::GetCapturedStderr();
      EXPECT_EQ(dstest::occurrences(err, "grad_accum_dtype = fp32 is not taken by a pipeline"),
                wider ? 1u : 0u)
          << "ZeRO-" << stage << "\n"
          << err;
    }
    EXPECT_EQ(gradient_bytes[1], gradient_bytes[0]) << "ZeRO-" << stage;
  }
}

// ZeRO-Offload's update during backward at stage 1 without pin_memory: a stage 1 that all-reduces
// (here: bf16 accumulating in fp32 over 2 micro-steps) would bring its gradients down into
// pageable memory on the engine's thread, so on a GPU it keeps the update after backward, and
// initialize says so, once; the reduce-scattering stage 1 stages its copies and is not warned
// about. (The warning's condition is the stage's choice, made in runtime/build_engine.cpp.)
TEST(ConfigRanks, AnAllReducingStage1WithOverlapStepAndNoPinnedMemoryIsWarnedOnce) {
  const char* const warning = "overlap_step is true but pin_memory is false";
  for (bool all_reducing : {false, true}) {
    auto config = dstest::base_config(1, 2, 1);
    config["bf16"] = {{"enabled", true}};
    config["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}, {"overlap_step", true}};
    if (all_reducing) config["data_types"] = {{"grad_accum_dtype", "fp32"}};
    ::testing::internal::CaptureStderr();
    run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
      deepspeed::initialize<gpt::GPTImpl>(
          {.model = tiny_gpt(), .config_json = config, .comm = comm, .device = "cpu"});
    });
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(dstest::occurrences(err, warning), all_reducing ? 1u : 0u) << err;
    if (all_reducing) EXPECT_CONTAINS(err, "accumulating wider than its parameters");
  }
}

// An error is every rank's: each one throws it (the others would wait for it otherwise).
TEST(ConfigRanks, AnErrorIsThrownOnEveryRank) {
  auto config = dstest::base_config(1, 1, 0);
  config["gradient_clipping"] = "one";
  std::mutex mu;
  int refused = 0;
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    const std::string message = dstest::message_of<deepspeed::ConfigError>([&] {
      deepspeed::initialize<gpt::GPTImpl>(
          {.model = tiny_gpt(), .config_json = config, .comm = comm, .device = "cpu"});
    });
    std::lock_guard<std::mutex> lock(mu);
    if (message.find("gradient_clipping") != std::string::npos) ++refused;
  });
  EXPECT_EQ(refused, 2);
}

}  // namespace config_ranks_test
