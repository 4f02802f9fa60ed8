// ZeRO-Infinity optimizer offload at stage 3: with offload_optimizer.device = "nvme" the fp32
// masters and Adam moments live in files and are streamed through sub-group buffers; training
// must give bit for bit the losses and weights of the in-memory run (the same vectorised Adam on
// the same numbers), in fp32 and bf16, with sub-groups small enough to exercise the pipeline.
// I/O problems must stop the job with an error naming the path.
#include <gtest/gtest.h>

#include <filesystem>

#include "deepspeed/errors.h"
#include "support/checkpoint_run.h"
#include "support/training_run.h"

namespace {

nlohmann::json nvme_config(nlohmann::json c, const std::string& dir, int64_t sub_group, int buffers) {
  c["zero_optimization"]["offload_optimizer"] = {
      {"device", "nvme"}, {"nvme_path", dir}, {"buffer_count", buffers}};
  c["zero_optimization"]["sub_group_size"] = sub_group;
  c["aio"] = {{"block_size", 8192}, {"queue_depth", 4}};
  return c;
}

}  // namespace

class NvmeOptimizerOffload : public ::testing::TestWithParam<std::tuple<bool, int>> {};

TEST_P(NvmeOptimizerOffload, SameLossesAndWeightsAsInMemory) {
  auto [bf16, buffers] = GetParam();
  dstest::RunSpec s;
  s.world_size = 2;
  s.steps = 6;
  s.config = dstest::base_config(2, 2, 3);
  s.config["gradient_clipping"] = 0.5;  // the clip coefficient reaches the swapped kernel too
  if (bf16) s.config["bf16"] = {{"enabled", true}};
  auto in_memory = dstest::train_gpt(s);

  dstest::TempDir dir;
  s.config = nvme_config(s.config, dir.path(), 3000, buffers);
  auto swapped = dstest::train_gpt(s);
  ASSERT_EQ(swapped.losses.size(), in_memory.losses.size());
  for (size_t i = 0; i < swapped.losses.size(); ++i)
    EXPECT_EQ(swapped.losses[i], in_memory.losses[i]) << "step " << i + 1;
  ASSERT_EQ(swapped.weights.size(), in_memory.weights.size());
  for (size_t i = 0; i < swapped.weights.size(); ++i)
    EXPECT_TRUE(torch::equal(swapped.weights[i], in_memory.weights[i])) << "parameter " << i;
  // Resident optimizer state: the sub-group buffers only, well under the in-memory 12 or 8 bytes
  // per element of the partition.
  for (int r = 0; r < 2; ++r)
    EXPECT_LT(swapped.memory[r].optimizer_states, in_memory.memory[r].optimizer_states) << "rank " << r;
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "swap files left behind";
}

INSTANTIATE_TEST_SUITE_P(PrecisionAndBuffers, NvmeOptimizerOffload,
                         ::testing::Values(std::make_tuple(false, 3), std::make_tuple(true, 2),
                                           std::make_tuple(true, 4)));

TEST(NvmeOptimizerOffloadErrors, MissingNvmePathIsNamed) {
  dstest::RunSpec s;
  s.world_size = 1;
  s.steps = 1;
  s.config = nvme_config(dstest::base_config(2, 1, 3), "/nonexistent/nvme/swap", 3000, 2);
  try {
    dstest::train_gpt(s);
    FAIL() << "expected IOError";
  } catch (const deepspeed::IOError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/nvme/swap"), std::string::npos) << e.what();
  }
}

// Not yet supported: saving swapped optimizer state. It must be refused on every rank, loudly.
TEST(NvmeOptimizerOffloadErrors, CheckpointIsRefusedNotWrittenWrong) {
  dstest::TempDir swap, ckpt;
  dstest::CheckpointJob job;
  job.world_size = 2;
  job.steps = 1;
  job.config = nvme_config(dstest::base_config(2, 1, 3), swap.path(), 3000, 2);
  job.save_dir = ckpt.path();
  job.save_at_end = true;
  try {
    dstest::run_checkpoint_job(job);
    FAIL() << "expected CheckpointError";
  } catch (const deepspeed::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("nvme"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(ckpt / "latest"));
}
