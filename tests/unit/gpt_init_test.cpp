// The example GPT's initialisation (gpt::gpt2_init): every Linear and Embedding weight N(0, 0.02);
// with scaled_residual_init (bench/gpu's rows, as their PyTorch and DeepSpeed peers) the two
// residual projections of each block N(0, 0.02 / sqrt(2 * n_layer)), drawn from the same random
// stream, so that everything else, and the default model, keeps its values.
// Tolerance: a sample std of N draws is off by about std / sqrt(2N); the smallest weight here
// has 128 x 128 = 16384 values (0.55%), so 5% is 9 of those while the scaled std is 4x smaller.
#include <gtest/gtest.h>

#include <cmath>

#include "gpt/model.h"

namespace gpt_init_test {

namespace {
gpt::GPTConfig config(bool scaled) {
  gpt::GPTConfig c;
  c.n_layer = 8;  // 0.02 / sqrt(16) = 0.005
  c.n_head = 4;
  c.n_embd = 128;
  c.block_size = 64;
  c.scaled_residual_init = scaled;
  return c;
}

gpt::GPT seeded_gpt(bool scaled) {
  torch::manual_seed(7);
  return gpt::GPT(config(scaled));
}

bool is_residual_projection(const std::string& name) {
  return name.find(".attn.proj.weight") != std::string::npos ||
         name.find(".mlp.proj.weight") != std::string::npos;
}

void expect_std(const std::string& name, const torch::Tensor& w, double want) {
  const double got = w.std().item<double>();
  EXPECT_NEAR(got, want, 0.05 * want) << name << " (" << w.numel() << " values)";
}
}  // namespace

TEST(GptInit, DefaultDrawsEveryWeightWithStd002) {
  auto model = seeded_gpt(false);
  int projections = 0;
  for (const auto& p : model->named_parameters()) {
    if (p.value().dim() < 2) continue;  // LayerNorm and biases
    expect_std(p.key(), p.value(), 0.02);
    projections += is_residual_projection(p.key());
  }
  EXPECT_EQ(projections, 2 * 8);
}

TEST(GptInit, ScaledResidualInitDrawsTheProjectionsWithStd002OverSqrt2L) {
  EXPECT_DOUBLE_EQ(gpt::residual_init_std(config(true)), 0.02 / std::sqrt(16.0));
  EXPECT_DOUBLE_EQ(gpt::residual_init_std(config(false)), 0.02);
  auto model = seeded_gpt(true);
  int projections = 0;
  for (const auto& p : model->named_parameters()) {
    if (p.value().dim() < 2) continue;
    const bool residual = is_residual_projection(p.key());
    expect_std(p.key(), p.value(), residual ? 0.005 : 0.02);
    projections += residual;
  }
  EXPECT_EQ(projections, 2 * 8);
}

// The same draws in the same order: the scaled model's projections are the default model's times
// 0.25 and every other weight is bit for bit the default's (CPU results stay as they were).
TEST(GptInit, ScaledInitKeepsTheRandomStreamAndEveryOtherWeight) {
  auto plain = seeded_gpt(false);
  auto scaled = seeded_gpt(true);
  auto a = plain->named_parameters(), b = scaled->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].key(), b[i].key());
    if (is_residual_projection(a[i].key()))
      EXPECT_TRUE(torch::allclose(b[i].value(), a[i].value() * 0.25, 1e-6, 1e-9)) << a[i].key();
    else
      EXPECT_TRUE(torch::equal(b[i].value(), a[i].value())) << a[i].key();
  }
}

// A block initialised alone (a pipeline layer, the unsplit block of a tensor-parallel pipeline
// layer) takes its projections' std from its own config.
TEST(GptInit, ABlockInitialisedAloneScalesItsProjections) {
  torch::manual_seed(7);
  gpt::Block block(config(true));
  gpt::gpt2_init(*block.ptr());
  for (const auto& p : block->named_parameters()) {
    if (p.value().dim() < 2) continue;
    const bool residual = p.key() == "attn.proj.weight" || p.key() == "mlp.proj.weight";
    expect_std(p.key(), p.value(), residual ? 0.005 : 0.02);
  }
}

}  // namespace gpt_init_test
