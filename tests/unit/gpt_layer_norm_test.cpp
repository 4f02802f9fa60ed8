// The example GPT's layer norm (gpt::LayerNorm): torch::nn::LayerNorm's parameters and names; a
// bf16 input on the CPU is normalised in fp32 and the result rounded to bf16 (as torch.autocast
// runs layer norm; libtorch 1.13's bf16 CPU layer norm is 2.4x slower than its fp32 one), and
// its parameters' gradients stay bf16. fp32 inputs take torch::nn::LayerNorm's forward unchanged.
#include <gtest/gtest.h>

#include "gpt/model.h"

namespace gpt_layer_norm_test {

namespace F = torch::nn::functional;

namespace {
gpt::LayerNorm seeded_norm(int64_t width) {
  torch::manual_seed(3);
  gpt::LayerNorm norm(torch::nn::LayerNormOptions({width}));
  torch::NoGradGuard no_grad;
  norm->weight.normal_(1.0, 0.2);
  norm->bias.normal_(0.0, 0.2);
  return norm;
}
}  // namespace

TEST(GptLayerNorm, Bf16InputIsNormalisedInFp32AndRoundedOnce) {
  auto norm = seeded_norm(64);
  norm->to(torch::kBFloat16);
  auto x = (torch::randn({4, 8, 64}) * 3 + 1).to(torch::kBFloat16);
  auto y = norm(x);
  ASSERT_EQ(y.scalar_type(), torch::kBFloat16);
  auto fp32 = F::layer_norm(x.to(torch::kFloat), F::LayerNormFuncOptions({64})
                                                     .weight(norm->weight.to(torch::kFloat))
                                                     .bias(norm->bias.to(torch::kFloat)));
  EXPECT_TRUE(torch::equal(y, fp32.to(torch::kBFloat16)));
  // Arithmetic in bf16 throughout rounds on the way and lands elsewhere on some elements (written
  // out: libtorch 2.x's own bf16 CPU layer_norm already computes in fp32 and rounds once, 1.13's
  // does not, so it cannot serve as the counter-example on both).
  auto centred = x - x.mean(-1, /*keepdim=*/true);
  auto all_bf16 = centred * torch::rsqrt((centred * centred).mean(-1, true) + 1e-5) * norm->weight +
                  norm->bias;
  ASSERT_EQ(all_bf16.scalar_type(), torch::kBFloat16);
  EXPECT_FALSE(torch::equal(y, all_bf16));
}

TEST(GptLayerNorm, Bf16GradientsFollowTheFp32Ones) {
  auto norm = seeded_norm(32);
  auto reference = seeded_norm(32);
  norm->to(torch::kBFloat16);
  auto x = torch::randn({16, 32});
  auto g = torch::randn({16, 32});
  norm(x.to(torch::kBFloat16)).backward(g.to(torch::kBFloat16));
  reference(x).backward(g);
  ASSERT_EQ(norm->weight.grad().scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::allclose(norm->weight.grad().to(torch::kFloat), reference->weight.grad(), 2e-2, 5e-2));
  EXPECT_TRUE(torch::allclose(norm->bias.grad().to(torch::kFloat), reference->bias.grad(), 2e-2, 5e-2));
}

TEST(GptLayerNorm, Fp32IsTorchLayerNorm) {
  auto norm = seeded_norm(48);
  auto x = torch::randn({5, 48});
  auto expected = F::layer_norm(x, F::LayerNormFuncOptions({48}).weight(norm->weight).bias(norm->bias));
  EXPECT_TRUE(torch::equal(norm(x), expected));
  auto names = norm->named_parameters().keys();
  EXPECT_EQ(names, (std::vector<std::string>{"weight", "bias"}));
}

// HF's AdamW groups find the model's norms as torch::nn::LayerNorm modules (no weight decay).
TEST(GptLayerNorm, CountsAsALayerNormForTheNoDecayGroup) {
  torch::nn::Sequential seq(gpt::LayerNorm(torch::nn::LayerNormOptions({8})),
                            torch::nn::Linear(8, 8));
  int norms = 0;
  for (const auto& m : seq->modules(/*include_self=*/false))
    if (m->as<torch::nn::LayerNorm>()) ++norms;
  EXPECT_EQ(norms, 1);
}

}  // namespace gpt_layer_norm_test
