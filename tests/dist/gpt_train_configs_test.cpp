// gpt_train with configs as real users write them (issue 13): no "optimizer" block (AdamW from its
// flags, said on the first line), the Hugging Face ZeRO-2/ZeRO-3 templates with "auto" everywhere
// (filled from the flags and the model, the filled keys printed), and fp16 on this CPU build
// (refused naming fp16.enabled, no C++ stack frames).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <tuple>

#include "support/cpu_half.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/training_run.h"

namespace gpt_train_configs_test {

namespace {
using nlohmann::json;

struct Run {
  bool ok = false;
  std::string output;
};

// gpt_train on a small model for `steps` steps; `config` is a path.
Run gpt_train(const dstest::TempDir& dir, const std::string& config, int steps,
              const std::string& extra = "") {
  const std::string log = dir / "log.txt";
  const std::string cmd =
      "exec " + dstest::bin_dir() + "/gpt_train --deepspeed_config " + config +
      " --n_layer 1 --n_head 2 --n_embd 32 --block_size 16 --threads 1 --steps " +
      std::to_string(steps) + " " + extra + " > " + log + " 2>&1";
  Run r;
  int status = std::system(cmd.c_str());
  r.ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  r.output = dstest::read_bytes(log);
  return r;
}

std::string write_config(const dstest::TempDir& dir, const json& config) {
  std::ofstream(dir / "ds_config.json") << config.dump(2);
  return dir / "ds_config.json";
}

std::map<int, std::string> step_losses(const std::string& output) {
  std::map<int, std::string> out;
  std::regex line(R"(step (\d+) loss ([0-9.]+))");
  for (std::sregex_iterator it(output.begin(), output.end(), line), end; it != end; ++it)
    out[std::stoi((*it)[1])] = (*it)[2];
  return out;
}

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

std::string example(const std::string& name) {
  return dstest::source_dir() + "/examples/gpt/" + name;
}

// The example config's optimizer, which gpt_train's flag defaults equal.
json with_optimizer_block(json config) {
  config["optimizer"] = {
      {"type", "AdamW"},
      {"params", {{"lr", 6e-4}, {"betas", {0.9, 0.99}}, {"eps", 1e-8}, {"weight_decay", 0.01}}}};
  return config;
}
}  // namespace

// Under optimizer offload the AdamW runs as the CPU Adam (zero_force_ds_cpu_optimizer false does
// not keep it off: the key is for other optimizers), which keeps HF's two groups: range by range
// (overlap_step) and swapped to nvme as in memory. With a strong decay (1% of a LayerNorm weight
// a step) the groups show in the losses: an offloaded run prints those of the in-memory run with
// the same groups, not those of the config's AdamW over one group, which decays every parameter.
TEST(GptTrainConfigs, NoOptimizerBlockUnderOptimizerOffloadKeepsHfGroups) {
  const std::string flags = "--lr 0.01 --weight_decay 1";
  json config = dstest::base_config(4, 1, 2);
  config.erase("optimizer");
  dstest::TempDir in_memory_dir, one_group_dir;
  auto in_memory = gpt_train(in_memory_dir, write_config(in_memory_dir, config), 4, flags);
  ASSERT_TRUE(in_memory.ok) << in_memory.output;
  json one_group = with_optimizer_block(config);
  one_group["optimizer"]["params"]["lr"] = 0.01;
  one_group["optimizer"]["params"]["weight_decay"] = 1.0;
  auto decayed = gpt_train(one_group_dir, write_config(one_group_dir, one_group), 4);
  ASSERT_TRUE(decayed.ok) << decayed.output;
  const auto losses = step_losses(in_memory.output);
  ASSERT_EQ(losses.size(), 4u) << in_memory.output;
  EXPECT_NE(losses, step_losses(decayed.output));

  dstest::TempDir cpu_dir, nvme_dir;
  json cpu = config;
  cpu["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}, {"overlap_step", true}};
  cpu["zero_force_ds_cpu_optimizer"] = false;
  json nvme = config;
  nvme["zero_optimization"]["offload_optimizer"] = {{"device", "nvme"},
                                                    {"nvme_path", nvme_dir.path()}};
  for (const auto& [what, dir, offload] :
       {std::tuple{"cpu, overlap_step", &cpu_dir, cpu}, {"nvme", &nvme_dir, nvme}}) {
    SCOPED_TRACE(what);
    auto run = gpt_train(*dir, write_config(*dir, offload), 4, flags);
    ASSERT_TRUE(run.ok) << run.output;
    EXPECT_CONTAINS(first_line(run.output),
                    "--weight_decay 1; biases and LayerNorm weights without weight decay), as "
                    "the Hugging Face Trainer does");
    EXPECT_EQ(step_losses(run.output), losses) << run.output;
  }
}

TEST(GptTrainConfigs, NoOptimizerBlockTrainsWithAdamWFromTheFlags) {
  dstest::TempDir dir;
  json config = dstest::base_config(4, 1, 2);
  config.erase("optimizer");
  // Optimizer offload runs the AdamW as the CPU Adam, with HF's two groups. Without weight decay
  // they step as the config's AdamW over one group does.
  config["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
  auto run = gpt_train(dir, write_config(dir, config), 4, "--weight_decay 0");
  ASSERT_TRUE(run.ok) << run.output;
  EXPECT_EQ(first_line(run.output)
                .rfind("gpt_train: the config has no \"optimizer\" block: training "
                       "with AdamW from the command line (--lr 0.0006",
                       0),
            0u)
      << run.output;
  EXPECT_CONTAINS(first_line(run.output),
                  "--weight_decay 0; biases and LayerNorm weights without weight decay)");
  auto losses = step_losses(run.output);
  ASSERT_EQ(losses.size(), 4u) << run.output;

  // The same AdamW written in the config: the same losses (to the 4 printed decimals).
  dstest::TempDir dir2;
  json block = with_optimizer_block(config);
  block["optimizer"]["params"]["weight_decay"] = 0.0;
  auto reference = gpt_train(dir2, write_config(dir2, block), 4);
  ASSERT_TRUE(reference.ok) << reference.output;
  EXPECT_EQ(losses, step_losses(reference.output));

  // --lr changes what the AdamW does.
  dstest::TempDir dir3;
  auto faster = gpt_train(dir3, write_config(dir3, config), 4, "--lr 0.01 --weight_decay 0");
  ASSERT_TRUE(faster.ok) << faster.output;
  EXPECT_NE(first_line(faster.output).find("--lr 0.01"), std::string::npos) << faster.output;
  EXPECT_NE(step_losses(faster.output)[4], losses[4]);
}

// At ZeRO stage 0 in fp32 the engine takes the AdamW's parameter groups as they are: biases and
// LayerNorm weights without weight decay, as the Hugging Face Trainer builds it; both groups'
// states are checkpointed (a resumed step 3 is the uninterrupted one's).
TEST(GptTrainConfigs, NoOptimizerBlockAtStage0ExemptsBiasesAndLayerNorms) {
  dstest::TempDir dir;
  json config = dstest::base_config(4, 1, 0);
  config.erase("optimizer");
  const std::string path = write_config(dir, config), ck = dir / "ck";
  auto full = gpt_train(dir, path, 3, "--exact_loss --save_dir " + ck + " --save_interval 2");
  ASSERT_TRUE(full.ok) << full.output;
  EXPECT_CONTAINS(first_line(full.output),
                  "--weight_decay 0.01; biases and LayerNorm weights without weight decay), as "
                  "the Hugging Face Trainer does");
  auto rest = gpt_train(dir, path, 3, "--exact_loss --load_dir " + ck);
  ASSERT_TRUE(rest.ok) << rest.output;
  EXPECT_CONTAINS(rest.output, "resumed from");
  std::regex exact(R"(step 3 loss [0-9.]+ exact (\S+))");
  std::smatch a, b;
  ASSERT_TRUE(std::regex_search(full.output, a, exact)) << full.output;
  ASSERT_TRUE(std::regex_search(rest.output, b, exact)) << rest.output;
  EXPECT_EQ(a[1], b[1]);
}

// ZeRO stages 1-3 and bf16 take the parameter groups too (zero/flat_groups.h).
TEST(GptTrainConfigs, NoOptimizerBlockAtStage2Bf16ExemptsBiasesAndLayerNorms) {
  dstest::TempDir dir;
  json config = dstest::base_config(4, 1, 2);
  config.erase("optimizer");
  config["bf16"] = {{"enabled", true}};
  auto run = gpt_train(dir, write_config(dir, config), 2);
  ASSERT_TRUE(run.ok) << run.output;
  EXPECT_CONTAINS(first_line(run.output), "biases and LayerNorm weights without weight decay");
  EXPECT_EQ(step_losses(run.output).size(), 2u) << run.output;
}

class HfTemplates : public ::testing::TestWithParam<const char*> {};

TEST_P(HfTemplates, TrainUnchangedWithTheFilledKeysPrinted) {
  dstest::TempDir dir;
  auto run = gpt_train(dir, example(GetParam()), 4, "--micro_batch 4 --warmup_steps 2");
  ASSERT_TRUE(run.ok) << run.output;
  EXPECT_EQ(step_losses(run.output).size(), 4u) << run.output;
  const std::string filled = "gpt_train: filled \"auto\" config keys";
  ASSERT_NE(run.output.find(filled), std::string::npos) << run.output;
  for (const char* key :
       {"optimizer.params.lr=0.0006", "optimizer.params.betas=[0.9,0.99]",
        "optimizer.params.eps=1e-08", "optimizer.params.weight_decay=0.01",
        "scheduler.params.warmup_min_lr=0", "scheduler.params.warmup_max_lr=0.0006",
        "scheduler.params.warmup_num_steps=2", "fp16.enabled=false", "bf16.enabled=false",
        "gradient_clipping=1.0", "zero_optimization.reduce_bucket_size=1024",
        "train_micro_batch_size_per_gpu=4", "gradient_accumulation_steps=1", "train_batch_size=4"})
    EXPECT_NE(run.output.find(key), std::string::npos) << key << "\n" << run.output;
  if (std::string(GetParam()).find("zero3") != std::string::npos) {
    EXPECT_NE(run.output.find("scheduler.params.total_num_steps=4"), std::string::npos);
    EXPECT_NE(run.output.find("zero_optimization.stage3_prefetch_bucket_size=921"),
              std::string::npos);  // int(0.9 * 32^2)
    EXPECT_NE(run.output.find("zero_optimization.stage3_param_persistence_threshold=320"),
              std::string::npos);
  }
}

TEST_P(HfTemplates, Bf16FlagFillsTheBf16Block) {
  dstest::TempDir dir;
  auto run = gpt_train(dir, example(GetParam()), 2, "--micro_batch 2 --bf16");
  ASSERT_TRUE(run.ok) << run.output;
  EXPECT_CONTAINS(run.output, "bf16.enabled=true");
  EXPECT_EQ(step_losses(run.output).size(), 2u) << run.output;
}

INSTANTIATE_TEST_SUITE_P(Zero2And3, HfTemplates,
                         ::testing::Values("ds_config_hf_zero2.json", "ds_config_hf_zero3.json"),
                         [](const auto& info) {
                           return std::string(info.param).find("zero3") != std::string::npos
                                      ? "zero3"
                                      : "zero2";
                         });

// libtorch 1.13 lacks CPU Half kernels the GPT needs: refused naming the key, no stack frames.
// libtorch 2.x has them: gpt_train trains in fp16 on the CPU (support/cpu_half.h).
TEST(GptTrainConfigs, Fp16OnTheCpuTrainsOrIsRefusedWithoutStackFrames) {
  dstest::TempDir dir;
  json config = dstest::base_config(2, 1, 1);
  config["fp16"] = {{"enabled", true}};
  auto run = gpt_train(dir, write_config(dir, config), 2);
  if (dstest::cpu_runs_the_gpt_in_fp16()) {
    ASSERT_TRUE(run.ok) << run.output;
    // Two finite losses (step_losses matches digits only: nan or inf would not count).
    EXPECT_EQ(step_losses(run.output).size(), 2u) << run.output;
    return;
  }
  EXPECT_FALSE(run.ok) << run.output;
  EXPECT_CONTAINS(run.output, "fp16.enabled");
  EXPECT_CONTAINS(run.output, "\"bf16\": {\"enabled\": true}");
  EXPECT_CONTAINS(run.output, "rank 0, forward");
  EXPECT_EQ(run.output.find("frame #"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("Exception raised from"), std::string::npos) << run.output;
}

// --n_embd not divisible by --n_head is refused naming both flags, without C++ stack frames (the
// model's TORCH_CHECK used to stop the run with its backtrace, naming neither flag).
TEST(GptTrainConfigs, HeadsThatDoNotDivideTheWidthNameBothFlags) {
  dstest::TempDir dir;
  const std::string config = write_config(dir, dstest::base_config(2, 1, 0)), log = dir / "log.txt";
  const int status = std::system(("exec " + dstest::bin_dir() + "/gpt_train --deepspeed_config " +
                                  config + " --n_layer 1 --n_embd 30 --n_head 4 --steps 1 > " +
                                  log + " 2>&1")
                                     .c_str());
  const std::string output = dstest::read_bytes(log);
  EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  EXPECT_CONTAINS(output, "gpt_train: error: --n_embd 30");
  EXPECT_CONTAINS(output, "--n_head 4");
  EXPECT_EQ(output.find("Exception raised from"), std::string::npos) << output;
}

// --save_dir without --save_interval saves once, after the last step, with the model flags
// gpt_generate reads (it used to save nothing, silently).
TEST(GptTrainConfigs, SaveDirAloneSavesAfterTheLastStep) {
  dstest::TempDir dir;
  const std::string ck = dir / "ck";
  auto run = gpt_train(dir, write_config(dir, dstest::base_config(2, 1, 0)), 2, "--save_dir " + ck);
  ASSERT_TRUE(run.ok) << run.output;
  EXPECT_CONTAINS(run.output, "gpt_train: saved " + ck + "/global_step2");
  EXPECT_EQ(run.output.find("global_step1"), std::string::npos) << run.output;
  EXPECT_EQ(dstest::read_bytes(ck + "/latest"), "global_step2");
  EXPECT_CONTAINS(dstest::read_bytes(ck + "/global_step2/gpt_model.json"), "\"n_embd\": 32");
}

// deepspeed::parse_args takes --deepspeed_config before CLI11 sees the command line, so CLI11's
// --help listed every flag but the one gpt_train requires.
TEST(GptTrainConfigs, HelpListsTheRequiredDeepspeedConfigFlag) {
  dstest::TempDir dir;
  const std::string log = dir / "help.txt";
  int status =
      std::system(("exec " + dstest::bin_dir() + "/gpt_train --help > " + log + " 2>&1").c_str());
  const std::string help = dstest::read_bytes(log);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << help;
  EXPECT_CONTAINS(help, "--deepspeed_config FILE");
  EXPECT_CONTAINS(help, "--local_rank");
  EXPECT_CONTAINS(help, "--steps");
}

}  // namespace gpt_train_configs_test
