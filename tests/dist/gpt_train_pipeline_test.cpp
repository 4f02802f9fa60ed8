// gpt_train --pipeline_stages: the GPT as a PipelineModule under dsrun. Two stages on two ranks
// print the losses of one stage on one rank (same global batch); a stage count that does not
// divide the world, or more stages than layers, stops the job with the value named.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>

#include <nlohmann/json.hpp>

#include "support/files.h"
#include "support/ranks.h"

namespace {
using nlohmann::json;

struct Run {
  bool ok = false;
  std::string output;
};

Run gpt_train(const dstest::TempDir& dir, int procs, const std::string& extra,
              int steps_per_print = 0) {
  json config = {{"train_micro_batch_size_per_gpu", 2},
                 {"gradient_accumulation_steps", 4},
                 {"steps_per_print", steps_per_print},
                 {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
                 {"zero_optimization", {{"stage", 1}}},
                 {"seed", 3}};
  std::ofstream(dir / "ds_config.json") << config.dump(2);
  const std::string log = dir / "log.txt";
  const std::string cmd = "exec " + dstest::bin_dir() + "/dsrun --num_procs " +
                          std::to_string(procs) + " --master_port " +
                          std::to_string(free_tcp_port()) + " " + dstest::bin_dir() +
                          "/gpt_train --deepspeed_config " + (dir / "ds_config.json") +
                          " --n_layer 2 --n_head 2 --n_embd 32 --block_size 16 --threads 1 "
                          "--steps 3 " + extra + " > " + log + " 2>&1";
  Run r;
  const int status = std::system(cmd.c_str());
  r.ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  r.output = dstest::read_bytes(log);
  return r;
}

std::map<int, std::string> step_losses(const std::string& output) {
  std::map<int, std::string> out;
  std::regex line(R"(step (\d+) loss ([0-9.]+))");
  for (std::sregex_iterator it(output.begin(), output.end(), line), end; it != end; ++it)
    out[std::stoi((*it)[1])] = (*it)[2];
  return out;
}

}  // namespace

TEST(GptTrainPipeline, TwoStagesPrintTheLossesOfOne) {
  dstest::TempDir a("gpt_pipe_a"), b("gpt_pipe_b");
  auto one = gpt_train(a, 1, "--pipeline_stages 1");
  auto two = gpt_train(b, 2, "--pipeline_stages 2", /*steps_per_print=*/1);
  ASSERT_TRUE(one.ok) << one.output;
  ASSERT_TRUE(two.ok) << two.output;
  EXPECT_NE(two.output.find("stage 1: layers"), std::string::npos) << two.output;
  EXPECT_EQ(step_losses(one.output).size(), 3u) << one.output;
  EXPECT_EQ(step_losses(two.output), step_losses(one.output)) << one.output << two.output;
  // The steps_per_print line comes once per step, from the stage that knows the loss (the first
  // stage used to print its own line with loss=0.0000).
  std::regex ds_line(R"(\[deepspeed\] step=\d+ skipped=\d+ loss=([0-9.]+))");
  int lines = 0;
  for (std::sregex_iterator it(two.output.begin(), two.output.end(), ds_line), end; it != end;
       ++it, ++lines)
    EXPECT_NE((*it)[1], "0.0000") << two.output;
  EXPECT_EQ(lines, 3) << two.output;
}

TEST(GptTrainPipeline, BadStageCountsNamed) {
  dstest::TempDir dir("gpt_pipe_bad");
  auto r = gpt_train(dir, 3, "--pipeline_stages 2");
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.output.find("pipeline.stages = 2 does not divide the world size 3"), std::string::npos)
      << r.output;
  // 2 blocks: 5 layers (embedding, 2 blocks, ln_f, head).
  r = gpt_train(dir, 6, "--pipeline_stages 6");
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.output.find("pipeline.stages = 6 is more than the 5 layers"), std::string::npos)
      << r.output;
}
