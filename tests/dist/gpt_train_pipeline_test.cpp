// gpt_train --pipeline_stages: the GPT as a PipelineModule under dsrun. Two stages on two ranks
// print the losses of one stage on one rank (same global batch); a stage count that does not
// divide the world, or more stages than layers, stops the job with the value named; a run
// resumed from a pipeline checkpoint continues bit for bit; a stage killed mid-run stops the job,
// dsrun naming the rank and the signal. The flags apply as without the pipeline: --seed (GPT-2
// initialised layers), --monitor_dir, the config read as hjson, its dataloader_drop_last; what
// cannot apply (--zero_init, no "optimizer" block) is refused by name.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>

#include <nlohmann/json.hpp>

#include "support/commands.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/ranks.h"

namespace gpt_train_pipeline_test {

namespace {
using nlohmann::json;

struct Run {
  bool ok = false;
  std::string output;
};

json pipeline_config(int steps_per_print) {
  return {{"train_micro_batch_size_per_gpu", 2},
          {"gradient_accumulation_steps", 4},
          {"steps_per_print", steps_per_print},
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
          {"zero_optimization", {{"stage", 1}}},
          {"seed", 3}};
}

// dsrun PROCS gpt_train on the small test GPT with `extra` flags (which include --steps).
std::string command(const dstest::TempDir& dir, int procs, const std::string& extra) {
  return dstest::dsrun_command(procs, "gpt_train --deepspeed_config " + (dir / "ds_config.json") +
                                          " --n_layer 2 --n_head 2 --n_embd 32 --block_size 16 "
                                          "--threads 1 " + extra);
}

// With `config_text` (non-empty) written as the config instead of pipeline_config().
Run gpt_train(const dstest::TempDir& dir, int procs, const std::string& extra,
              int steps_per_print = 0, const std::string& config_text = "") {
  std::ofstream(dir / "ds_config.json")
      << (config_text.empty() ? pipeline_config(steps_per_print).dump(2) : config_text);
  const std::string log = dir / "log.txt";
  const std::string cmd = "exec " + command(dir, procs, extra) + " > " + log + " 2>&1";
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

// Step -> the loss as --exact_loss prints it (a hex float).
std::map<int, std::string> exact_losses(const std::string& output) {
  std::regex exact(R"(step (\d+) loss [0-9.]+ exact (\S+))");
  std::map<int, std::string> m;
  for (std::sregex_iterator it(output.begin(), output.end(), exact), end; it != end; ++it)
    m[std::stoi((*it)[1])] = (*it)[2];
  return m;
}

double loss_at(const Run& r, int step) {
  const auto losses = step_losses(r.output);
  return losses.count(step) ? std::stod(losses.at(step)) : -1.0;
}

}  // namespace

TEST(GptTrainPipeline, TwoStagesPrintTheLossesOfOne) {
  dstest::TempDir a("gpt_pipe_a"), b("gpt_pipe_b");
  auto one = gpt_train(a, 1, "--pipeline_stages 1 --steps 3");
  auto two = gpt_train(b, 2, "--pipeline_stages 2 --steps 3", /*steps_per_print=*/1);
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

// --tensor_parallel 2 with --pipeline_stages 2 on 4 ranks (pipe 2 x data 1 x tensor 2) prints the
// losses of one stage on one rank (the same micro-batches: one data-parallel rank in both), and a
// checkpoint of it resumes bit for bit.
TEST(GptTrainPipeline, TensorParallelStagesPrintTheLossesOfOne) {
  dstest::TempDir a("gpt_pipe_tp_a"), b("gpt_pipe_tp_b");
  auto one = gpt_train(a, 1, "--pipeline_stages 1 --steps 3");
  auto four = gpt_train(b, 4, "--pipeline_stages 2 --tensor_parallel 2 --steps 3 --exact_loss");
  ASSERT_TRUE(one.ok) << one.output;
  ASSERT_TRUE(four.ok) << four.output;
  EXPECT_NE(four.output.find("2 stages x 1 data-parallel x 2 tensor-parallel"), std::string::npos)
      << four.output;
  EXPECT_EQ(step_losses(one.output).size(), 3u) << one.output;
  EXPECT_EQ(step_losses(four.output), step_losses(one.output)) << one.output << four.output;
  // Saved at step 1 (DeepSpeed's layer_LL-model_TT layout) and resumed: steps 2 and 3 are the
  // uninterrupted run's, bit for bit.
  const std::string ck = b / "ck", flags = "--pipeline_stages 2 --tensor_parallel 2 --exact_loss";
  auto first = gpt_train(b, 4, flags + " --steps 1 --save_dir " + ck + " --save_interval 1");
  auto rest = gpt_train(b, 4, flags + " --steps 3 --load_dir " + ck);
  ASSERT_TRUE(first.ok) << first.output;
  ASSERT_TRUE(rest.ok) << rest.output;
  EXPECT_NE(rest.output.find("resumed from"), std::string::npos) << rest.output;
  const auto want = exact_losses(four.output), got = exact_losses(rest.output);
  ASSERT_EQ(want.size(), 3u) << four.output;
  ASSERT_EQ(got.size(), 2u) << rest.output;
  EXPECT_EQ(got.at(2), want.at(2));
  EXPECT_EQ(got.at(3), want.at(3));
}

// --dropout with --tensor_parallel 2 (no pipeline): the residual dropout after the row layers
// draws the unsplit GPT's masks (every tensor rank the same), so tp 2 prints the losses of one
// process, including under activation checkpointing (the recompute draws them again); and
// dropout did act (the losses differ from a run without it).
TEST(GptTrainPipeline, TensorParallelDropoutDrawsTheMasksOfTheUnsplitGpt) {
  dstest::TempDir a("gpt_tp_drop_a"), b("gpt_tp_drop_b"), c("gpt_tp_drop_c");
  auto one = gpt_train(a, 1, "--steps 3 --dropout 0.2");
  auto two = gpt_train(b, 2, "--steps 3 --dropout 0.2 --tensor_parallel 2 --activation_checkpointing");
  auto plain = gpt_train(c, 1, "--steps 3");
  ASSERT_TRUE(one.ok) << one.output;
  ASSERT_TRUE(two.ok) << two.output;
  ASSERT_TRUE(plain.ok) << plain.output;
  EXPECT_EQ(step_losses(one.output).size(), 3u) << one.output;
  EXPECT_EQ(step_losses(two.output), step_losses(one.output)) << one.output << two.output;
  EXPECT_NE(step_losses(plain.output), step_losses(one.output)) << plain.output;
}

// gpt_train gives --pipeline_stages as PipelineModule.num_stages, the key the errors name, and
// says it came from the flag.
TEST(GptTrainPipeline, BadStageCountsNamed) {
  dstest::TempDir dir("gpt_pipe_bad");
  auto r = gpt_train(dir, 3, "--pipeline_stages 2 --steps 3");
  EXPECT_FALSE(r.ok);
  EXPECT_CONTAINS(r.output, "PipelineModule.num_stages = 2 does not divide the world size 3");
  EXPECT_CONTAINS(r.output, "[gpt_train: PipelineModule.num_stages is --pipeline_stages 2]");
  // 2 blocks: 5 layers (embedding, 2 blocks, ln_f, head).
  r = gpt_train(dir, 6, "--pipeline_stages 6 --steps 3");
  EXPECT_FALSE(r.ok);
  EXPECT_CONTAINS(r.output, "PipelineModule.num_stages = 6 is more than the 5 layers");
}

// Saved at step 2 of 4 (pipe 2 on 2 ranks) and resumed: steps 3 and 4 are those of the
// uninterrupted run, bit for bit (--exact_loss prints each loss as a hex float too).
TEST(GptTrainPipeline, ResumesFromAPipelineCheckpoint) {
  dstest::TempDir a("gpt_pipe_full"), b("gpt_pipe_resume");
  const std::string ck = b / "ck";
  auto full = gpt_train(a, 2, "--pipeline_stages 2 --steps 4 --exact_loss");
  auto first = gpt_train(b, 2, "--pipeline_stages 2 --steps 2 --exact_loss --save_dir " + ck +
                                   " --save_interval 2");
  auto rest = gpt_train(b, 2, "--pipeline_stages 2 --steps 4 --exact_loss --load_dir " + ck);
  ASSERT_TRUE(first.ok) << first.output;
  ASSERT_TRUE(rest.ok) << rest.output;
  EXPECT_NE(rest.output.find("resumed from"), std::string::npos) << rest.output;
  const auto want = exact_losses(full.output), got = exact_losses(rest.output);
  ASSERT_EQ(want.size(), 4u) << full.output;
  ASSERT_EQ(got.size(), 2u) << rest.output;
  EXPECT_EQ(got.at(3), want.at(3));
  EXPECT_EQ(got.at(4), want.at(4));
  EXPECT_EQ(exact_losses(first.output).at(2), want.at(2));
}

// The last stage is SIGKILLed while the pipeline runs: dsrun stops the first stage (blocked in
// a receive from it) and exits 128 + 9, naming rank 1 and the signal, within seconds.
TEST(GptTrainPipeline, ADeadStageStopsTheJobNamingIt) {
  dstest::TempDir dir("gpt_pipe_dead");
  std::ofstream(dir / "ds_config.json") << pipeline_config(0).dump(2);
  const std::string log = dir / "log.txt";
  // The config path is unique to this test run: it tells pkill which process is rank 1.
  const std::string script =
      command(dir, 2, "--pipeline_stages 2 --steps 1000000") + " > " + log + " 2>&1 & job=$!\n" +
      "for i in $(seq 1200); do grep -q 'step 2 loss' " + log + " && break; sleep 0.1; done\n" +
      "pkill -9 -f -- '--local_rank=1 --deepspeed_config " + (dir / "ds_config.json") + "'\n" +
      "start=$(date +%s%N); wait $job; status=$?; end=$(date +%s%N)\n" +
      "echo \"job_status=$status stop_ms=$(( (end - start) / 1000000 ))\" >> " + log + "\n";
  std::ofstream(dir / "kill.sh") << script;
  ASSERT_EQ(std::system(("bash " + (dir / "kill.sh")).c_str()), 0);
  const std::string out = dstest::read_bytes(log);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(job_status=(\d+) stop_ms=(\d+))"))) << out;
  EXPECT_EQ(m[1], "137") << out;
  EXPECT_LT(std::stoi(m[2]), 20000) << out;
  EXPECT_NE(out.find("rank 1 (pid"), std::string::npos) << out;
  EXPECT_NE(out.find("was killed by signal 9 (SIGKILL)"), std::string::npos) << out;
}

// --seed seeds the layers (as it seeds the whole GPT without the pipeline; the config's "seed"
// is 3 in both runs), and the layers start GPT-2 style (N(0, 0.02)): the first loss is about
// ln(256) = 5.5 as without the pipeline, not the ~40 of PyTorch's default initialisation (a
// tied head over N(0, 1) embeddings).
TEST(GptTrainPipeline, SeedFlagSeedsTheGpt2InitialisedLayers) {
  dstest::TempDir a("gpt_pipe_seed1"), b("gpt_pipe_seed2"), c("gpt_plain_seed1");
  const std::string flags = " --steps 1 --tie_embeddings";
  auto one = gpt_train(a, 1, "--pipeline_stages 1 --seed 1" + flags);
  auto two = gpt_train(b, 1, "--pipeline_stages 1 --seed 2" + flags);
  auto plain = gpt_train(c, 1, "--seed 1" + flags);
  ASSERT_TRUE(one.ok) << one.output;
  ASSERT_TRUE(two.ok) << two.output;
  ASSERT_TRUE(plain.ok) << plain.output;
  EXPECT_NE(step_losses(one.output).at(1), step_losses(two.output).at(1)) << one.output;
  EXPECT_LT(loss_at(one, 1), 10.0) << one.output;
  EXPECT_NEAR(loss_at(one, 1), loss_at(plain, 1), 0.5) << one.output << plain.output;
}

// --monitor_dir DIR writes the CSV monitor files into DIR/gpt_train/, one row per step from the
// stage that knows the loss (the last), tokens/s included; --wall_clock_breakdown is taken too.
TEST(GptTrainPipeline, MonitorDirWritesTheCsvFiles) {
  dstest::TempDir dir("gpt_pipe_monitor");
  auto r = gpt_train(dir, 2,
                     "--pipeline_stages 2 --steps 3 --wall_clock_breakdown --monitor_dir " +
                         dir.path());
  ASSERT_TRUE(r.ok) << r.output;
  const std::string csv = dstest::read_bytes(dir / "gpt_train/Train_Samples_train_loss.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 4) << csv;  // the header and 3 steps
  // gpt_train adds the tokens/s event, as without the pipeline.
  const std::string tokens =
      dstest::read_bytes(dir / "gpt_train/Train_Samples_tokens_per_second.csv");
  EXPECT_EQ(std::count(tokens.begin(), tokens.end(), '\n'), 4) << tokens;
}

// A config with no "optimizer" block, and --zero_init, are refused naming the flag: the pipeline
// engine builds its optimizer from the config, and builds each stage's layers itself.
TEST(GptTrainPipeline, NoOptimizerBlockAndZeroInitAreRefusedByName) {
  dstest::TempDir dir("gpt_pipe_refused");
  json config = pipeline_config(0);
  config.erase("optimizer");
  auto r = gpt_train(dir, 1, "--pipeline_stages 1 --steps 1", 0, config.dump(2));
  EXPECT_FALSE(r.ok) << r.output;
  EXPECT_NE(r.output.find("has no \"optimizer\" block"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--pipeline_stages"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("InitializeArgs"), std::string::npos) << r.output;
  r = gpt_train(dir, 1, "--pipeline_stages 1 --steps 1 --zero_init");
  EXPECT_FALSE(r.ok) << r.output;
  EXPECT_NE(r.output.find("--zero_init"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--pipeline_stages"), std::string::npos) << r.output;
}

// --pipeline_stages -1 reads the stage count from a config as DeepSpeed reads it (hjson: a '#'
// comment, a trailing comma).
TEST(GptTrainPipeline, StageCountFromAnHjsonConfig) {
  dstest::TempDir dir("gpt_pipe_hjson");
  const std::string config = R"({
    # two stages
    "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, "steps_per_print": 0,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "pipeline": {"stages": 2,},
  })";
  auto r = gpt_train(dir, 2, "--pipeline_stages -1 --steps 1", 0, config);
  ASSERT_TRUE(r.ok) << r.output;
  EXPECT_NE(r.output.find("pipeline 2 stages"), std::string::npos) << r.output;
}

// --activation_checkpointing with --pipeline_stages: every layer of each stage is a checkpointed
// segment, recomputed in backward (the flag used to be ignored there: the interval stayed the
// config's pipeline.activation_checkpoint_interval, 0), and with activation_checkpointing.profile
// each stage prints its counts as gpt_train without the pipeline does. Recomputation changes no
// number: the losses are those of the run without the flag, bit for bit.
TEST(GptTrainPipeline, ActivationCheckpointingRecomputesEveryStagesLayers) {
  dstest::TempDir a("gpt_pipe_ac"), b("gpt_pipe_no_ac");
  json config = pipeline_config(0);
  config["activation_checkpointing"] = {{"profile", true}};
  const std::string flags = "--pipeline_stages 2 --steps 2 --exact_loss";
  auto with = gpt_train(a, 2, flags + " --activation_checkpointing", 0, config.dump(2));
  auto without = gpt_train(b, 2, flags, 0, config.dump(2));
  ASSERT_TRUE(with.ok) << with.output;
  ASSERT_TRUE(without.ok) << without.output;
  const std::regex counts(
      R"(gpt_train: stage (\d): activation checkpointing: (\d+) segment forwards, (\d+) recomputations)");
  auto per_stage = [&](const std::string& output) {
    std::map<int, std::pair<int, int>> out;  // stage -> (forwards, recomputations)
    for (std::sregex_iterator it(output.begin(), output.end(), counts), end; it != end; ++it)
      out[std::stoi((*it)[1])] = {std::stoi((*it)[2]), std::stoi((*it)[3])};
    return out;
  };
  const auto checkpointed = per_stage(with.output);
  ASSERT_EQ(checkpointed.size(), 2u) << with.output;
  for (const auto& [stage, n] : checkpointed) {
    // 2 steps x 4 micro-batches, at least one layer each: every segment recomputed once.
    EXPECT_GE(n.first, 8) << "stage " << stage << "\n" << with.output;
    EXPECT_EQ(n.second, n.first) << "stage " << stage << "\n" << with.output;
  }
  for (const auto& [stage, n] : per_stage(without.output))
    EXPECT_EQ(n.second, 0) << "stage " << stage << "\n" << without.output;
  const auto losses = exact_losses(with.output);
  ASSERT_EQ(losses.size(), 2u) << with.output;
  EXPECT_EQ(losses, exact_losses(without.output));
}

// A resumed job puts its loader at the samples the checkpoint trained (global_samples), counted
// in its own micro-batches per data-parallel rank: saved after 2 steps of 16 samples (micro 2 x
// accumulation 4 x 2 data ranks) and resumed at accumulation 8, its step 3 trains samples 32..63,
// those of step 2 of a run at accumulation 8 from the start. With lr 0 the weights never change,
// so a step's loss tells its samples. (The position used to be global steps x the new job's
// accumulation: 2 x 8 = 16 micro-batches per rank, samples 64..127, step 3's.)
TEST(GptTrainPipeline, AResumeAtAnotherAccumulationContinuesAfterTheTrainedSamples) {
  dstest::TempDir a("gpt_pipe_samples_ref"), b("gpt_pipe_samples_resume");
  auto config = [](int accumulation) {
    json c = pipeline_config(0);
    c["gradient_accumulation_steps"] = accumulation;
    c["optimizer"]["params"]["lr"] = 0.0;
    return c.dump(2);
  };
  const std::string ck = b / "ck", flags = "--pipeline_stages 1 --exact_loss";
  auto reference = gpt_train(a, 2, flags + " --steps 3", 0, config(8));
  auto first = gpt_train(b, 2, flags + " --steps 2 --save_dir " + ck + " --save_interval 2", 0,
                         config(4));
  auto rest = gpt_train(b, 2, flags + " --steps 3 --load_dir " + ck, 0, config(8));
  ASSERT_TRUE(reference.ok) << reference.output;
  ASSERT_TRUE(first.ok) << first.output;
  ASSERT_TRUE(rest.ok) << rest.output;
  const auto want = exact_losses(reference.output), got = exact_losses(rest.output);
  ASSERT_EQ(want.size(), 3u) << reference.output;
  ASSERT_EQ(got.size(), 1u) << rest.output;
  EXPECT_NE(want.at(2), want.at(3));  // the steps' samples tell apart
  EXPECT_EQ(got.at(3), want.at(2)) << rest.output;
}

// dataloader_drop_last applies: on a text of 9 windows (micro-batches of 2, 4 per step) the
// epoch's last micro-batch holds one window unless it is dropped, so step 2 differs between the
// two settings (step 1 does not). The short micro-batch crosses the stage boundary.
TEST(GptTrainPipeline, DataloaderDropLastFromTheConfig) {
  dstest::TempDir dir("gpt_pipe_drop_last");
  // block 16, stride 8: (84 - 17) / 8 + 1 = 9 windows.
  const std::string text = dstest::read_bytes(dstest::source_dir() + "/data/fortunes.txt");
  dstest::write_bytes(dir / "text.txt", text.substr(0, 84));
  std::map<bool, std::map<int, std::string>> losses;
  for (bool drop : {false, true}) {
    json config = pipeline_config(0);
    config["dataloader_drop_last"] = drop;
    auto r = gpt_train(dir, 2, "--pipeline_stages 2 --steps 2 --data " + (dir / "text.txt"), 0,
                       config.dump(2));
    ASSERT_TRUE(r.ok) << r.output;
    losses[drop] = step_losses(r.output);
    ASSERT_EQ(losses[drop].size(), 2u) << r.output;
  }
  EXPECT_EQ(losses[false].at(1), losses[true].at(1));
  EXPECT_NE(losses[false].at(2), losses[true].at(2));
}

// With dataloader_drop_last a text shorter than one micro-batch per data-parallel rank gives an
// empty epoch: refused naming the config keys (the loader itself knows only its arguments).
TEST(GptTrainPipeline, AnEpochOfNoMicroBatchNamesTheConfigKeys) {
  dstest::TempDir dir("gpt_pipe_empty_epoch");
  const std::string text = dstest::read_bytes(dstest::source_dir() + "/data/fortunes.txt");
  dstest::write_bytes(dir / "text.txt", text.substr(0, 84));  // 9 windows
  json config = pipeline_config(0);
  config["train_micro_batch_size_per_gpu"] = 16;
  config["dataloader_drop_last"] = true;
  auto r = gpt_train(dir, 1, "--pipeline_stages 1 --steps 1 --data " + (dir / "text.txt"), 0,
                     config.dump(2));
  EXPECT_FALSE(r.ok) << r.output;
  EXPECT_CONTAINS(r.output, "train_micro_batch_size_per_gpu 16, dataloader_drop_last true");
}

}  // namespace gpt_train_pipeline_test
