// zero_optimization.load_from_fp32_weights: true (the default) restores the fp32 masters from the
// checkpoint's optimizer files; false takes them from the loaded 16-bit module weights (DeepSpeed's
// _restore_from_bit16_weights) and still restores the moments. Checked by loading a bf16
// checkpoint at every ZeRO stage, with CPU and NVMe optimizer offload, saving it again at once and
// reading both checkpoints whole.
#include <gtest/gtest.h>

#include <string>

#include "support/checkpoint_run.h"
#include "support/files.h"
#include "support/training_run.h"

namespace load_from_fp32_weights_test {

using dstest::CheckpointJob;
using dstest::ConsolidatedState;
using dstest::consolidated_state;
using dstest::run_checkpoint_job;
using Named = std::vector<std::pair<std::string, torch::Tensor>>;

struct Case {
  int stage;
  std::string precision;  // "bf16" or "fp32" (libtorch 1.13 has no CPU fp16 LayerNorm)
  std::string offload;    // offload_optimizer.device: "none", "cpu" or "nvme"
  bool bf16_masters = false;  // bf16.bf16_master_weights_and_grads
  std::string label() const {
    return "stage " + std::to_string(stage) + " " + precision + " " + offload +
           (bf16_masters ? " bf16 masters" : "");
  }
};

CheckpointJob job(const Case& c, const std::string& swap_dir) {
  CheckpointJob j;
  j.world_size = 2;
  j.model = gpt::GPTConfig{256, 9, 1, 2, 14};
  j.config = dstest::base_config(1, 1, c.stage);
  if (c.precision != "fp32") j.config[c.precision] = {{"enabled", true}};
  if (c.bf16_masters) j.config["bf16"]["bf16_master_weights_and_grads"] = true;
  if (c.offload == "cpu") j.config["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
  if (c.offload == "nvme")
    j.config["zero_optimization"]["offload_optimizer"] = {{"device", "nvme"},
                                                          {"nvme_path", swap_dir}};
  j.steps = 3;
  return j;
}

// Saves 3 steps of `c`, loads them into a new engine of the same case with the key set to
// `from_fp32` and saves that at once: the two checkpoints read whole.
std::pair<ConsolidatedState, ConsolidatedState> save_load_save(const Case& c, bool from_fp32) {
  dstest::TempDir root;
  auto first = job(c, root / "swap_a");
  first.save_dir = root / "a";
  first.save_at_end = true;
  run_checkpoint_job(first);
  auto second = job(c, root / "swap_b");
  second.config["zero_optimization"]["load_from_fp32_weights"] = from_fp32;
  second.model_seed = 99;  // loading must win over the new engine's own initial weights
  second.load_dir = root / "a";
  second.save_dir = root / "b";
  second.save_at_end = true;
  run_checkpoint_job(second);
  return {consolidated_state(root / "a"), consolidated_state(root / "b")};
}

void expect_equal(const Named& got, const Named& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(torch::equal(got[i].second, want[i].second)) << what << " " << want[i].first;
}

// The saved masters as the module holds them: rounded to the 16-bit dtype and widened again.
Named as_module_weights(const Named& masters, torch::Dtype dtype) {
  Named out;
  for (const auto& [name, t] : masters) out.emplace_back(name, t.to(dtype).to(torch::kFloat32));
  return out;
}

TEST(LoadFromFp32Weights, FalseTakesTheMastersFromTheSixteenBitWeightsAndKeepsTheMoments) {
  for (Case c : {Case{0, "bf16", "none"}, Case{1, "bf16", "none"}, Case{2, "bf16", "none"},
                 Case{2, "bf16", "cpu"}, Case{3, "bf16", "none"}, Case{3, "bf16", "nvme"}}) {
    const auto [saved, loaded] = save_load_save(c, /*from_fp32=*/false);
    const Named rounded = as_module_weights(saved.fp32, torch::kBFloat16);
    // The check can fail: three steps leave masters that 16 bits do not hold exactly.
    bool any_rounded = false;
    for (size_t i = 0; i < rounded.size(); ++i)
      any_rounded = any_rounded || !torch::equal(rounded[i].second, saved.fp32[i].second);
    EXPECT_TRUE(any_rounded) << c.label();
    expect_equal(loaded.fp32, rounded, c.label() + " fp32 master");
    expect_equal(loaded.exp_avg, saved.exp_avg, c.label() + " exp_avg");
    expect_equal(loaded.exp_avg_sq, saved.exp_avg_sq, c.label() + " exp_avg_sq");
    EXPECT_EQ(loaded.meta["optimizer"]["adam_step"], 3) << c.label();
  }
}

// 16-bit masters (bf16_master_weights_and_grads) are the module's weights themselves: with the
// key false the loaded engine holds the saved masters (not its own initial ones, which a load
// that rounds its widened copies back at the end would restore) and the moments.
TEST(LoadFromFp32Weights, FalseWithSixteenBitMastersLoadsTheSavedOnes) {
  for (Case c : {Case{2, "bf16", "cpu", true}, Case{3, "bf16", "cpu", true},
                 Case{2, "bf16", "nvme", true}}) {
    for (bool from_fp32 : {false, true}) {
      const std::string label = c.label() + (from_fp32 ? " true" : " false");
      const auto [saved, loaded] = save_load_save(c, from_fp32);
      expect_equal(loaded.fp32, saved.fp32, label + " master");
      expect_equal(loaded.exp_avg, saved.exp_avg, label + " exp_avg");
      expect_equal(loaded.exp_avg_sq, saved.exp_avg_sq, label + " exp_avg_sq");
    }
  }
}

TEST(LoadFromFp32Weights, TrueAndFp32TrainingRestoreTheSavedMasters) {
  for (auto [c, from_fp32] : {std::pair{Case{2, "bf16", "none"}, true},
                              std::pair{Case{3, "bf16", "none"}, true},
                              std::pair{Case{2, "fp32", "none"}, false}}) {
    const auto [saved, loaded] = save_load_save(c, from_fp32);
    const std::string label = c.label() + (from_fp32 ? " true" : " false");
    expect_equal(loaded.fp32, saved.fp32, label + " fp32 master");
    expect_equal(loaded.exp_avg, saved.exp_avg, label + " exp_avg");
  }
}

}  // namespace load_from_fp32_weights_test
