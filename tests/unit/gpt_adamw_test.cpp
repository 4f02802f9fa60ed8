// gpt_train's AdamW when the config has no "optimizer" block (gpt::hf_adamw): as the Hugging Face
// Trainer builds it, the biases and LayerNorm parameters sit in a group of their own with weight
// decay 0, everything else in the group with --weight_decay; every parameter once. Without the
// exemption (what optimizer offload's CPU Adam takes: one group) every parameter is decayed.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "gpt/hf_adamw.h"
#include "gpt/model.h"
#include "gpt/pipeline_model.h"

namespace gpt_adamw_test {

namespace {

gpt::GPTConfig small_gpt(bool tied) {
  gpt::GPTConfig c;
  c.vocab_size = 64;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.tie_embeddings = tied;
  return c;
}

torch::optim::AdamWOptions options() {
  return torch::optim::AdamWOptions(1e-3).betas({0.9, 0.99}).eps(1e-8).weight_decay(0.1);
}

// Parameter name -> the weight decay of the group holding it (-1: in no group); fails when a
// parameter is in two groups.
std::map<std::string, double> decay_of(torch::nn::Module& model, torch::optim::AdamW& adamw) {
  std::map<const void*, double> by_tensor;
  for (auto& group : adamw.param_groups()) {
    const double wd = static_cast<torch::optim::AdamWOptions&>(group.options()).weight_decay();
    for (auto& p : group.params())
      EXPECT_TRUE(by_tensor.emplace(p.unsafeGetTensorImpl(), wd).second) << "in two groups";
  }
  std::map<std::string, double> out;
  for (auto& item : model.named_parameters()) {
    auto it = by_tensor.find(item.value().unsafeGetTensorImpl());
    out[item.key()] = it == by_tensor.end() ? -1.0 : it->second;
  }
  return out;
}

// In the whole GPT the LayerNorms are named ln1, ln2, ln_f.
bool is_bias_or_norm(const std::string& name) {
  return name.find("ln") != std::string::npos ||
         (name.size() >= 4 && name.substr(name.size() - 4) == "bias");
}

}  // namespace

TEST(GptAdamW, BiasesAndLayerNormsAreNotDecayed) {
  torch::manual_seed(0);
  gpt::GPTImpl model(small_gpt(false));
  auto adamw = gpt::hf_adamw(model, options(), /*exempt_bias_and_norm=*/true);
  ASSERT_EQ(adamw->param_groups().size(), 2u);
  const auto decay = decay_of(model, *adamw);
  int exempt = 0, decayed = 0;
  for (const auto& [name, wd] : decay) {
    if (is_bias_or_norm(name)) {
      EXPECT_EQ(wd, 0.0) << name;
      ++exempt;
    } else {
      EXPECT_EQ(wd, 0.1) << name;
      ++decayed;
    }
  }
  // ln1, ln2 (weight, bias) and 4 Linear biases per block, ln_f's two: 2 * 8 + 2.
  EXPECT_EQ(exempt, 18);
  // wte, wpe, head, and 4 Linear weights per block.
  EXPECT_EQ(decayed, 11);
  EXPECT_EQ(decay.at("ln_f.weight"), 0.0);
  EXPECT_EQ(decay.at("wte.weight"), 0.1);
}

// The pipeline's layers (gpt_pipeline, the head tied to the embedding): a LayerNorm is known by
// its type, not its name (ln_f is "layers.layer_03"), and the tied embedding is one parameter.
TEST(GptAdamW, PipelineLayersEachParameterOnce) {
  torch::manual_seed(0);
  deepspeed::pipe::PipelineSequentialImpl model(gpt::gpt_pipeline(small_gpt(true)), 7);
  auto adamw = gpt::hf_adamw(model, options(), true);
  size_t in_groups = 0;
  for (auto& g : adamw->param_groups()) in_groups += g.params().size();
  EXPECT_EQ(in_groups, model.parameters().size());
  const auto decay = decay_of(model, *adamw);
  int exempt = 0;
  for (const auto& [name, wd] : decay) {
    EXPECT_NE(wd, -1.0) << name;
    exempt += wd == 0.0;
  }
  EXPECT_EQ(exempt, 18);  // as the whole GPT's: ln_f and the blocks' LayerNorms and biases
  EXPECT_EQ(decay.at("layers.layer_03.weight"), 0.0);
  EXPECT_EQ(decay.at("layers.layer_03.bias"), 0.0);
  EXPECT_EQ(decay.at("layers.tied_embed.wte.weight"), 0.1);
}

TEST(GptAdamW, WithoutTheExemptionOneGroupDecaysEverything) {
  torch::manual_seed(0);
  gpt::GPTImpl model(small_gpt(false));
  auto adamw = gpt::hf_adamw(model, options(), /*exempt_bias_and_norm=*/false);
  ASSERT_EQ(adamw->param_groups().size(), 1u);
  for (const auto& [name, wd] : decay_of(model, *adamw)) EXPECT_EQ(wd, 0.1) << name;
}

}  // namespace gpt_adamw_test
