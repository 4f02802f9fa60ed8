// Real process deaths: gpt_train saves every 2 steps and is SIGKILLed during its second save
// (DS_CHECKPOINT_TEST_KILL_AT=<point>@global_step4) at every point the saver names: before any
// file, before/after its optim-states file, before/after the model-states file, before the
// manifest, before and after `latest`. Then: `latest` names a checkpoint that loads (in a fresh
// engine here), global_step4 loads exactly when its manifest was written, and gpt_train resumed
// with --load_dir continues with the losses of an uninterrupted run, bit for bit.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include "checkpoint/tag_reader.h"
#include "deepspeed/errors.h"
#include "support/checkpoint_run.h"
#include "support/files.h"
#include "support/training_run.h"

namespace checkpoint_kill_test {

namespace {
using dstest::bin_dir;

struct Run {
  int status = 0;
  std::string output;
};

// gpt_train on the test model, printing each loss exactly; `extra` holds flags, `env` a prefix of
// VAR=value assignments.
Run gpt_train(const dstest::TempDir& dir, const std::string& extra, const std::string& env = "") {
  const std::string log = dir / "log.txt";
  const std::string cmd = env + " exec " + bin_dir() + "/gpt_train --deepspeed_config " +
                          (dir / "ds_config.json") +
                          " --n_layer 2 --n_head 2 --n_embd 32 --block_size 16 --threads 1" +
                          " --exact_loss " + extra + " > " + log + " 2>&1";
  Run r;
  r.status = std::system(cmd.c_str());
  r.output = dstest::read_bytes(log);
  return r;
}

bool killed(const Run& r) { return WIFSIGNALED(r.status) && WTERMSIG(r.status) == SIGKILL; }
bool succeeded(const Run& r) { return WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0; }

// Step -> its loss as --exact_loss prints it (a hex float): compared as text, equal only when the
// doubles are (the 4-decimal loss beside it would hide a resume that is off in the 5th digit).
std::map<int, std::string> step_losses(const std::string& output) {
  std::map<int, std::string> out;
  std::regex line(R"(step (\d+) loss [0-9.]+ exact (\S+))");
  for (std::sregex_iterator it(output.begin(), output.end(), line), end; it != end; ++it)
    out[std::stoi((*it)[1])] = (*it)[2];
  return out;
}

void write_config(const dstest::TempDir& dir) {
  std::ofstream(dir / "ds_config.json") << dstest::base_config(2, 1, 1).dump();
}

int64_t loaded_step(const std::string& save_dir, const std::string& tag) {
  auto e = dstest::make_single_engine(dstest::base_config(2, 1, 1));
  e.engine->load_checkpoint(save_dir, tag);
  return e.engine->global_steps();
}
}  // namespace

class CheckpointKill : public ::testing::TestWithParam<const char*> {};

TEST_P(CheckpointKill, PreviousCheckpointStaysLoadable) {
  const std::string point = GetParam();
  dstest::TempDir dir;
  write_config(dir);
  const std::string save = dir / "ckpt";
  auto r = gpt_train(dir, "--steps 6 --save_interval 2 --save_dir " + save,
                     "DS_CHECKPOINT_TEST_KILL_AT=" + point + "@global_step4");
  ASSERT_TRUE(killed(r)) << "status " << r.status << "\n" << r.output;
  auto printed = step_losses(r.output);
  ASSERT_FALSE(printed.empty()) << r.output;
  EXPECT_EQ(printed.rbegin()->first, 4) << r.output;

  const bool published = point == "after_latest";
  const bool complete = published || point == "before_latest";
  EXPECT_EQ(deepspeed::checkpoint::read_latest_tag(deepspeed::checkpoint::posix_file_system(), save),
            published ? "global_step4" : "global_step2");
  EXPECT_EQ(loaded_step(save, ""), published ? 4 : 2);
  if (complete) {
    EXPECT_EQ(loaded_step(save, "global_step4"), 4);
  } else {
    EXPECT_THROW(loaded_step(save, "global_step4"), deepspeed::CheckpointError);
  }
}

INSTANTIATE_TEST_SUITE_P(Checkpoint, CheckpointKill,
                         ::testing::Values("start", "before_optim_file", "after_optim_file",
                                           "before_model_file", "after_model_file",
                                           "before_manifest", "before_latest", "after_latest"),
                         [](const auto& info) { return std::string(info.param); });

TEST(CheckpointKill, GptTrainResumesWithTheUninterruptedLosses) {
  dstest::TempDir dir;
  write_config(dir);
  auto full = gpt_train(dir, "--steps 6");
  ASSERT_TRUE(succeeded(full)) << full.output;
  const std::string save = dir / "ckpt";
  auto killed_run = gpt_train(dir, "--steps 6 --save_interval 2 --save_dir " + save,
                              "DS_CHECKPOINT_TEST_KILL_AT=before_manifest@global_step4");
  ASSERT_TRUE(killed(killed_run)) << killed_run.output;
  auto resumed = gpt_train(dir, "--steps 6 --save_interval 2 --save_dir " + save + " --load_dir " + save);
  ASSERT_TRUE(succeeded(resumed)) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from " + save + "/global_step2"), std::string::npos) << resumed.output;
  auto want = step_losses(full.output), got = step_losses(resumed.output);
  ASSERT_EQ(want.size(), 6u) << full.output;
  ASSERT_EQ(got.size(), 4u) << resumed.output;
  for (int step = 3; step <= 6; ++step) EXPECT_EQ(got[step], want[step]) << "step " << step;
  // The resumed job saved step 4 again over the incomplete folder, and step 6.
  EXPECT_EQ(loaded_step(save, "global_step4"), 4);
  EXPECT_EQ(loaded_step(save, ""), 6);
}

}  // namespace checkpoint_kill_test
