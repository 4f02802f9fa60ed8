// Low-precision masters (bf16.bf16_master_weights_and_grads, bf16_optimizer_states) with the
// optimizer swapped to NVMe (offload_optimizer.device "nvme") over two ranks: the file holds a
// bf16 master with fp32 or bf16 moments. So:
//  - training is bit for bit the CPU-offload run of the same formats (the same update, its state
//    read from and written back to a file sub-group by sub-group);
//  - the state the swap keeps in memory (its ring of sub-group buffers) shrinks with the formats
//    (10 or 6 bytes an element against fp32's 12), as does the file;
//  - a checkpoint saved from the swap resumes bit for bit, and loads into the CPU-offload run.
#include <gtest/gtest.h>

#include "deepspeed/deepspeed.h"
#include "support/checkpoint_run.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/resume_alike.h"
#include "support/training_run.h"

namespace low_precision_swap_test {
namespace {

enum class Masters { kFp32, kBf16WithFp32Moments, kBf16WithBf16Moments };

const char* name_of(Masters m) {
  return m == Masters::kFp32                  ? "fp32 masters"
         : m == Masters::kBf16WithFp32Moments ? "bf16 masters, fp32 moments"
                                              : "bf16 masters, bf16 moments";
}

// `nvme_dir` empty: offload_optimizer "cpu"; else "nvme" there, in sub-groups of 3000 elements
// through two buffers (several sub-groups per rank: the ring is used).
nlohmann::json config(int stage, Masters masters, const std::string& nvme_dir) {
  auto c = dstest::base_config(2, 1, stage);
  c["bf16"] = {{"enabled", true}};
  if (masters != Masters::kFp32) c["bf16"]["bf16_master_weights_and_grads"] = true;
  if (masters == Masters::kBf16WithBf16Moments) c["bf16"]["bf16_optimizer_states"] = true;
  c["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
  if (stage == 3) c["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
  if (!nvme_dir.empty()) {
    c["zero_optimization"]["offload_optimizer"] = {
        {"device", "nvme"}, {"nvme_path", nvme_dir}, {"buffer_count", 2}};
    c["zero_optimization"]["sub_group_size"] = 3000;
    c["aio"] = {{"block_size", 8192}, {"queue_depth", 4}};
  }
  return c;
}

dstest::RunResult train(int stage, Masters masters, const std::string& nvme_dir, int steps) {
  dstest::RunSpec s;
  s.world_size = 2;
  s.steps = steps;
  s.config = config(stage, masters, nvme_dir);
  return dstest::train_gpt(s);
}

}  // namespace

class Bf16MastersSwapped : public ::testing::TestWithParam<int> {};

TEST_P(Bf16MastersSwapped, TrainsAsCpuOffloadWithLessStateInMemory) {
  const int stage = GetParam();
  dstest::TempDir dir;
  const auto fp32 = train(stage, Masters::kFp32, dir.path(), 4);
  for (Masters m : {Masters::kBf16WithFp32Moments, Masters::kBf16WithBf16Moments}) {
    SCOPED_TRACE(name_of(m));
    const auto in_memory = train(stage, m, "", 4);
    const auto swapped = train(stage, m, dir.path(), 4);
    EXPECT_EQ(swapped.losses, in_memory.losses);
    EXPECT_TRUE(dstest::bit_identical(swapped.weights, in_memory.weights));
    // The swap's buffers hold a sub-group's state in the formats' widths: 2 + 8 or 2 + 4 bytes an
    // element where fp32 masters take 12 (each array on 64 bytes, each buffer rounded up to 4096
    // bytes: at most 4096 more a buffer, two buffers a rank).
    const int64_t want = m == Masters::kBf16WithBf16Moments ? 6 : 10;
    EXPECT_NEAR(static_cast<double>(dstest::optimizer_state_bytes(swapped)),
                static_cast<double>(dstest::optimizer_state_bytes(fp32)) * want / 12, 2 * 2 * 4096)
        << dstest::optimizer_state_bytes(swapped) << " bytes against fp32 masters' "
        << dstest::optimizer_state_bytes(fp32);
  }
  // The swapped runs part from fp32 masters' as the in-memory ones do, and train.
  const auto fp32_long = train(stage, Masters::kFp32, dir.path(), 12);
  const auto low_long = train(stage, Masters::kBf16WithBf16Moments, dir.path(), 12);
  EXPECT_FALSE(dstest::bit_identical(low_long.weights, fp32_long.weights));
  EXPECT_LT(low_long.losses.back(), 0.8 * low_long.losses.front());
  EXPECT_LT(std::abs(low_long.losses.back() - fp32_long.losses.back()),
            0.05 * fp32_long.losses.back());
}

INSTANTIATE_TEST_SUITE_P(Stages, Bf16MastersSwapped, ::testing::Values(1, 2, 3));

// ZeRO-Infinity's whole state in files: stage 3 with the parameter partition swapped too
// (offload_param "nvme"), each sub-group's bf16 output written into the parameter file. The same
// training as with the optimizer in host memory beside the swapped parameters.
TEST(Bf16MastersSwapped, WithTheParametersSwappedToo) {
  dstest::TempDir params, optimizer;
  auto run = [&](const std::string& nvme_dir) {
    dstest::RunSpec s;
    s.world_size = 2;
    s.steps = 4;
    s.config = config(3, Masters::kBf16WithFp32Moments, nvme_dir);
    s.config["zero_optimization"]["offload_param"] = {{"device", "nvme"},
                                                      {"nvme_path", params.path()},
                                                      {"buffer_count", 2},
                                                      {"buffer_size", 100000},
                                                      {"max_in_cpu", 0}};
    s.config["aio"] = {{"block_size", 8192}, {"queue_depth", 4}};
    return dstest::train_gpt(s);
  };
  const auto host = run(""), swapped = run(optimizer.path());
  EXPECT_EQ(swapped.losses, host.losses);
  EXPECT_TRUE(dstest::bit_identical(swapped.weights, host.weights));
  EXPECT_LT(dstest::optimizer_state_bytes(swapped), dstest::optimizer_state_bytes(host));
}

// Saved from the swap (bf16 masters and moments) at step 2 and resumed from it: bit for bit the
// uninterrupted run. The same checkpoint loads into the CPU-offload run of the same formats,
// which then takes the same steps.
TEST(Bf16MastersSwappedCheckpoint, ResumesBitForBitAndLoadsIntoCpuOffload) {
  for (int stage : {2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    dstest::TempDir nvme, dir;
    dstest::CheckpointJob job;
    job.world_size = 2;
    job.config = config(stage, Masters::kBf16WithBf16Moments, nvme.path());
    const auto midway = dstest::expect_resumed_midway_bit_for_bit(job, dir.path());
    dstest::CheckpointJob resume = midway.resume;
    const auto& whole = midway.whole;
    const auto& resumed = midway.resumed;

    resume.config = config(stage, Masters::kBf16WithBf16Moments, "");
    const auto in_memory = dstest::run_checkpoint_job(resume);
    EXPECT_EQ(in_memory.losses, resumed.losses);
    EXPECT_TRUE(dstest::bit_identical(in_memory.weights, whole.weights));
  }
}

}  // namespace low_precision_swap_test
