// zero_memory_options (a ds_config read for the estimator as initialize() reads it) and the
// ds_estimate program that prints it.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "deepspeed/config.h"
#include "deepspeed/errors.h"
#include "deepspeed/memory.h"
#include "support/expect.h"
#include "support/files.h"

namespace estimate_config_test {
namespace {

using nlohmann::json;

json base(int stage) {
  return {{"train_micro_batch_size_per_gpu", 2},
          {"gradient_accumulation_steps", 1},
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
          {"zero_optimization", {{"stage", stage}}}};
}

deepspeed::ZeroMemoryOptions options_of(const json& doc, int world = 4, bool gpu = false) {
  std::vector<std::string> warnings;
  return deepspeed::zero_memory_options(deepspeed::parse_config(doc, world, {}, &warnings), world,
                                        gpu);
}

// Runs ds_estimate with `args`: exit status and output (stdout and stderr).
std::pair<int, std::string> ds_estimate(const std::string& args, const std::string& log) {
  const int status =
      std::system((dstest::bin_dir() + "/ds_estimate " + args + " > " + log + " 2>&1").c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, dstest::read_bytes(log)};
}

}  // namespace

TEST(ZeroMemoryOptions, ReadsPlacementAndPrecisionKeys) {
  json doc = base(3);
  doc["bf16"] = {
      {"enabled", true}, {"bf16_master_weights_and_grads", true}, {"bf16_optimizer_states", true}};
  doc["zero_optimization"]["sub_group_size"] = 1000;
  doc["zero_optimization"]["zero_hpz_partition_size"] = 2;
  doc["zero_optimization"]["offload_optimizer"] = {
      {"device", "nvme"}, {"nvme_path", "/tmp"}, {"buffer_count", 3}};
  doc["zero_optimization"]["offload_param"] = {
      {"device", "nvme"}, {"nvme_path", "/tmp"}, {"max_in_cpu", 12345}};
  const auto o = options_of(doc, 4, /*gpu=*/true);
  EXPECT_EQ(o.world_size, 4);
  EXPECT_EQ(o.stage, 3);
  EXPECT_TRUE(o.mixed_precision);
  EXPECT_TRUE(o.low_precision_masters);
  EXPECT_TRUE(o.bf16_moments);
  EXPECT_TRUE(o.gpu);
  EXPECT_EQ(o.hpz_partition_size, 2);
  EXPECT_EQ(o.offload_optimizer, "nvme");
  EXPECT_EQ(o.offload_param, "nvme");
  EXPECT_EQ(o.sub_group_size, 1000);
  EXPECT_EQ(o.optimizer_buffer_count, 3);
  EXPECT_EQ(o.param_buffer_count, 5);  // DeepSpeed's offload_param default
  EXPECT_EQ(o.param_max_in_cpu, 12345);
  EXPECT_FALSE(o.widening_step);  // AdamW reads 16-bit gradients as they are
  EXPECT_EQ(o.grad_accum_bytes, 0);
  // The low-precision keys of a disabled block are not read (initialize() warns and ignores).
  json off = base(2);
  off["bf16"] = {{"enabled", false}, {"bf16_master_weights_and_grads", true}};
  EXPECT_FALSE(options_of(off).low_precision_masters);
  EXPECT_FALSE(options_of(off).mixed_precision);
  // fp16 masters: the fp16 block's key.
  json fp16 = base(2);
  fp16["fp16"] = {{"enabled", true}, {"fp16_master_weights_and_grads", true}};
  EXPECT_TRUE(options_of(fp16).low_precision_masters);
  EXPECT_FALSE(options_of(fp16).bf16_moments);
}

// data_types.grad_accum_dtype resolved as memory.h says initialize() does, and an optimizer
// other than Adam/AdamW stepping a widened copy of 16-bit gradients.
TEST(ZeroMemoryOptions, ResolvesTheGradientWidthAndTheOptimizer) {
  json bf16_stage0 = base(0);
  bf16_stage0["bf16"] = {{"enabled", true}};
  EXPECT_EQ(options_of(bf16_stage0).grad_accum_bytes, 0);  // one micro-step sums nothing
  bf16_stage0["gradient_accumulation_steps"] = 2;
  EXPECT_EQ(options_of(bf16_stage0).grad_accum_bytes, 4);  // DeepSpeed's BF16_Optimizer
  EXPECT_EQ(options_of(bf16_stage0).accumulation_steps, 2);
  json explicit_fp32 = base(2);
  explicit_fp32["bf16"] = {{"enabled", true}};
  explicit_fp32["data_types"] = {{"grad_accum_dtype", "fp32"}};
  EXPECT_EQ(options_of(explicit_fp32).grad_accum_bytes, 4);  // stage 2 keeps it always
  explicit_fp32["zero_optimization"]["stage"] = 1;
  EXPECT_EQ(options_of(explicit_fp32).grad_accum_bytes, 0);
  explicit_fp32["communication_data_type"] = "fp32";  // a wider all-reduce sums in it
  EXPECT_EQ(options_of(explicit_fp32).grad_accum_bytes, 4);
  json sgd = base(2);
  sgd["optimizer"] = {{"type", "SGD"}, {"params", {{"lr", 0.1}}}};
  EXPECT_TRUE(options_of(sgd).widening_step);
  json adam = base(2);
  adam["optimizer"]["type"] = "ADAM";
  EXPECT_FALSE(options_of(adam).widening_step);
  // The optimizer's moments: SGD's momentum buffer only with momentum (libtorch's default 0).
  EXPECT_EQ(options_of(adam).optimizer_moments, 2);
  EXPECT_EQ(options_of(sgd).optimizer_moments, 0);
  sgd["optimizer"]["params"]["momentum"] = 0.9;
  EXPECT_EQ(options_of(sgd).optimizer_moments, 1);
  json lion = base(2);
  lion["optimizer"] = {{"type", "Lion"}, {"params", {{"lr", 1e-4}}}};
  EXPECT_EQ(options_of(lion).optimizer_moments, 1);
  EXPECT_TRUE(options_of(lion).widening_step);
  json adagrad = base(2);
  adagrad["optimizer"] = {{"type", "Adagrad"}, {"params", {{"lr", 1e-2}}}};
  EXPECT_EQ(options_of(adagrad).optimizer_moments, 1);
  json lamb = base(2);
  lamb["optimizer"] = {{"type", "Lamb"}, {"params", {{"lr", 1e-3}}}};
  EXPECT_EQ(options_of(lamb).optimizer_moments, 2);
  EXPECT_EQ(options_of(lamb).onebit_optimizer, "");
  // The 1-bit optimizers by DeepSpeed's spelling, whatever the config's case (stage 0 only).
  json onebit = base(2);
  onebit["zero_optimization"]["stage"] = 0;
  const std::pair<const char*, const char*> onebit_types[] = {
      {"OneBitAdam", "OneBitAdam"}, {"zerooneadam", "ZeroOneAdam"}, {"ONEBITLAMB", "OneBitLamb"}};
  for (const auto& [type, spelled] : onebit_types) {
    onebit["optimizer"] = {{"type", type}, {"params", {{"lr", 1e-3}}}};
    EXPECT_EQ(options_of(onebit).onebit_optimizer, spelled);
    EXPECT_EQ(options_of(onebit).optimizer_moments, 2);
  }
  // ... and so their estimate: an fp32 model at stage 2 over 4 ranks, the partition its own
  // master, Lion's one moment.
  EXPECT_EQ(deepspeed::estimate_zero_memory(4000000, options_of(lion)).optimizer_states,
            4 * 1000000);
  // The estimate of a config follows its keys: bf16 masters and moments take 4 of 12 bytes.
  json lowp = base(2);
  lowp["bf16"] = {
      {"enabled", true}, {"bf16_master_weights_and_grads", true}, {"bf16_optimizer_states", true}};
  EXPECT_EQ(deepspeed::estimate_zero_memory(4000000, options_of(lowp)).optimizer_states,
            4 * 4000000 / 4);
}

TEST(DsEstimate, PrintsTheConfigsPlacementAndWhetherItFits) {
  dstest::TempDir dir;
  json doc = base(3);
  doc["bf16"] = {{"enabled", true}};
  doc["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
  doc["zero_optimization"]["offload_param"] = {{"device", "cpu"}};
  std::ofstream(dir / "ds_config.json") << doc.dump();
  // 1.5B parameters (GPT-2 XL's shape, seed 003) on 8 GPUs of one node, largest layer 31.5M.
  const auto [status, out] =
      ds_estimate("--deepspeed_config " + (dir / "ds_config.json") +
                      " --params 1500000000 --largest_layer 31500000 --world_size 8 --device cuda "
                      "--gpu_gib 24 --host_gib 64",
                  dir / "log");
  ASSERT_EQ(status, 0) << out;
  EXPECT_CONTAINS(out, "on a GPU, optimizer offloaded to cpu, parameters offloaded to cpu");
  EXPECT_CONTAINS(out, "| on host (MB)\n");
  // Stage 3: 2 + 2 + 12 = 16 bytes a parameter in host memory, 3 GB a rank, 24 GB a node; the
  // GPU holds the gathered layer (4 x 31.5M bytes = 0.12 GiB).
  EXPECT_CONTAINS(out, "peak 2.91 GiB (0.12 GiB on the GPU (fits in 24.00 GiB), 2.79 GiB in host");
  EXPECT_CONTAINS(out, "host memory of a node (8 ranks): 22.35 GiB (fits in 64.00 GiB)");
  EXPECT_CONTAINS(out, "host memory a parameter, all ranks together: 16.00 bytes");
  // A key the config parser refuses is named; so is a missing file.
  doc["zero_optimization"]["offload_optimizer"]["device"] = "disk";
  std::ofstream(dir / "bad.json") << doc.dump();
  auto [bad_status, bad] =
      ds_estimate("--deepspeed_config " + (dir / "bad.json") + " --params 10", dir / "log2");
  EXPECT_EQ(bad_status, 1);
  EXPECT_CONTAINS(bad, "ds_estimate: error:");
  EXPECT_CONTAINS(bad, "zero_optimization.offload_optimizer.device");
  auto [missing_status, missing] =
      ds_estimate("--deepspeed_config " + (dir / "none.json") + " --params 10", dir / "log3");
  EXPECT_EQ(missing_status, 1);
  EXPECT_CONTAINS(missing, "none.json");
}

}  // namespace estimate_config_test
