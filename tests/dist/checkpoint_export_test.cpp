// ds_to_fp32: a checkpoint saved by 3 ranks at ZeRO stage 2 (each holding a third of the masters)
// consolidates into one safetensors file of full fp32 weights; Debian's python3-torch reads it
// with its own parser (tests/support/checkpoint_read_safetensors.py) and finds every tensor equal
// to the trained weights.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>

#include "support/checkpoint_run.h"
#include "support/files.h"
#include "support/training_run.h"

namespace checkpoint_export_test {

TEST(CheckpointExport, DsToFp32WritesSafetensorsThatPyTorchReads) {
  if (std::system("/usr/bin/python3 -c 'import torch' > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "/usr/bin/python3 with torch (Debian's python3-torch) is not installed";
  dstest::TempDir dir;
  dstest::CheckpointJob job;
  job.world_size = 3;
  job.config = dstest::base_config(2, 1, 2);
  job.steps = 3;
  job.save_dir = dir / "ckpt";
  job.save_at_end = true;
  auto trained = dstest::run_checkpoint_job(job);

  // Expected values as raw float32 files: parameters in registration order, then buffers.
  torch::manual_seed(0);
  gpt::GPTImpl shape_model(job.model);
  nlohmann::json expected = nlohmann::json::array();
  size_t i = 0;
  for (auto& item : shape_model.named_parameters()) {
    const auto& w = trained.weights.at(i);
    const std::string file = "t" + std::to_string(i++) + ".bin";
    dstest::write_bytes(dir / file, std::string(static_cast<const char*>(w.data_ptr()), w.numel() * 4));
    expected.push_back({{"name", item.key()}, {"shape", w.sizes().vec()}, {"file", file}});
  }
  for (auto& item : shape_model.named_buffers()) {  // buffers are not trained: the fresh model's
    auto b = item.value().to(torch::kFloat).contiguous();
    const std::string file = "t" + std::to_string(i++) + ".bin";
    dstest::write_bytes(dir / file, std::string(static_cast<const char*>(b.data_ptr()), b.numel() * 4));
    expected.push_back({{"name", item.key()}, {"shape", b.sizes().vec()}, {"file", file}});
  }
  std::ofstream(dir / "expected.json") << expected.dump();

  const std::string out = dir / "model_fp32.safetensors";
  const std::string tool = dstest::bin_dir() + "/ds_to_fp32 " + (dir / "ckpt") + " " + out;
  int status = std::system((tool + " > " + (dir / "tool.log") + " 2>&1").c_str());
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << dstest::read_bytes(dir / "tool.log");

  const std::string script = dstest::source_dir() + "/tests/support/checkpoint_read_safetensors.py";
  status = std::system(("/usr/bin/python3 " + script + " " + out + " " + dir.path() + " > " +
                        (dir / "py.log") + " 2>&1").c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << dstest::read_bytes(dir / "py.log");
}

TEST(CheckpointExport, DsToFp32RefusesACorruptedCheckpoint) {
  dstest::TempDir dir;
  dstest::CheckpointJob job;
  job.world_size = 2;
  job.config = dstest::base_config(2, 1, 1);
  job.steps = 1;
  job.save_dir = dir / "ckpt";
  job.save_at_end = true;
  dstest::run_checkpoint_job(job);
  const std::string victim = dir / "ckpt/global_step1/zero_pp_rank_1_mp_rank_00_optim_states.safetensors";
  std::string bytes = dstest::read_bytes(victim);
  bytes[bytes.size() - 5] ^= 1;
  dstest::write_bytes(victim, bytes);
  const std::string log = dir / "tool.log";
  int status = std::system((dstest::bin_dir() + "/ds_to_fp32 " + (dir / "ckpt") + " " +
                            (dir / "out.safetensors") + " > " + log + " 2>&1").c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1);
  const std::string output = dstest::read_bytes(log);
  EXPECT_NE(output.find(victim), std::string::npos) << output;
  EXPECT_NE(output.find("corrupted"), std::string::npos) << output;
}

}  // namespace checkpoint_export_test
