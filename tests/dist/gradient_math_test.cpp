// The gradient arithmetic of a step, checked against a reference computed here with plain
// libtorch autograd (no engine code): the mean of the ranks' gradients, un-scaled by the fp16 loss
// scale, averaged once whatever prescale_gradients / gradient_predivide_factor say, clipped by
// min(1, c / (||g|| + 1e-6)), and get_global_grad_norm() the norm of that mean gradient.
// The equivalence tests elsewhere train with AdamW, whose update m / sqrt(v) is blind to a
// constant factor on the gradients: a loss scale left in, a mean taken twice or a wrong clip
// coefficient would pass them. These tests step with plain SGD (no momentum), whose update is
// lr * g, so any such factor moves the weights by a multiple of the whole update.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "deepspeed/deepspeed.h"
#include "support/expect.h"
#include "support/ranks.h"
#include "support/training_run.h"

namespace gradient_math_test {

namespace {

constexpr int kWorld = 2;
constexpr int kBatch = 8;

// Initial values, fp16-representable so that the fp16 and fp32 runs start from the same point.
std::vector<torch::Tensor> initial_weights() {
  auto gen = at::detail::createCPUGenerator(77);
  return {(torch::randn({8, 8}, gen) * 0.5).to(torch::kHalf).to(torch::kFloat),
          (torch::randn({8}, gen) * 0.1).to(torch::kHalf).to(torch::kFloat),
          (torch::randn({4, 8}, gen) * 0.5).to(torch::kHalf).to(torch::kFloat)};
}

// The loss of one batch; parameters of any dtype, computed in fp32 (libtorch 1.13 has no Half
// matmul on CPU), so the engine's model and the reference share it.
torch::Tensor loss_of(const std::vector<torch::Tensor>& w, const torch::Tensor& x,
                      const torch::Tensor& y) {
  auto h = torch::tanh(x.matmul(w[0].to(torch::kFloat).t()) + w[1].to(torch::kFloat));
  return (h.matmul(w[2].to(torch::kFloat).t()) - y).pow(2).sum(1).mean();
}

struct TinyNetImpl : torch::nn::Module {
  TinyNetImpl() {
    auto init = initial_weights();
    w1 = register_parameter("w1", init[0]);
    b1 = register_parameter("b1", init[1]);
    w2 = register_parameter("w2", init[2]);
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
    return loss_of({w1, b1, w2}, x, y);
  }
  torch::Tensor w1, b1, w2;
};
TORCH_MODULE(TinyNet);

// Rank r's micro-batch number m (counted over the whole run), fp16-representable, from
// generators of its own (rank threads draw at once).
std::pair<torch::Tensor, torch::Tensor> batch(int rank, int micro) {
  auto gen = at::detail::createCPUGenerator(500 + 10 * micro + rank);
  auto x = torch::randn({kBatch, 8}, gen).to(torch::kHalf).to(torch::kFloat);
  auto y = torch::randn({kBatch, 4}, gen).to(torch::kHalf).to(torch::kFloat);
  return {x, y};
}

std::vector<torch::Tensor> gradient_of(const std::vector<torch::Tensor>& weights, int rank,
                                       int micro) {
  std::vector<torch::Tensor> w;
  for (auto& t : weights) w.push_back(t.detach().clone().requires_grad_(true));
  auto [x, y] = batch(rank, micro);
  return torch::autograd::grad({loss_of(w, x, y)}, w);
}

double norm_of(const std::vector<torch::Tensor>& g) {
  double sq = 0.0;
  for (auto& t : g) sq += t.to(torch::kDouble).pow(2).sum().item<double>();
  return std::sqrt(sq);
}

// The plain data-parallel SGD recipe: g = mean over ranks and micro-batches, clipped to norm
// `clip` (0: not clipped) as DeepSpeed/PyTorch do, fp32 masters, fp16 weights rounded from them.
struct Reference {
  std::vector<torch::Tensor> weights;  // as fp32 values
  double last_norm = 0.0;              // ||g|| of the last step, before clipping
  double smallest_rank_gradient = 1e9; // smallest nonzero |g| of any rank's micro-batch
};
Reference reference(int steps, int accumulation, double lr, bool fp16, double clip = 0.0) {
  Reference r;
  auto masters = initial_weights();
  r.weights = masters;
  for (int step = 0; step < steps; ++step) {
    std::vector<torch::Tensor> mean;
    for (int rank = 0; rank < kWorld; ++rank)
      for (int m = 0; m < accumulation; ++m) {
        auto g = gradient_of(r.weights, rank, step * accumulation + m);
        for (size_t i = 0; i < g.size(); ++i) {
          auto nonzero = g[i].abs().masked_select(g[i] != 0);
          if (nonzero.numel() > 0)
            r.smallest_rank_gradient = std::min(r.smallest_rank_gradient, nonzero.min().item<double>());
          if (mean.size() <= i) mean.push_back(torch::zeros_like(g[i]));
          mean[i] += g[i] / (kWorld * accumulation);
        }
      }
    r.last_norm = norm_of(mean);
    const double coef = clip > 0.0 ? std::min(1.0, clip / (r.last_norm + 1e-6)) : 1.0;
    for (size_t i = 0; i < masters.size(); ++i) {
      masters[i] -= lr * coef * mean[i];
      r.weights[i] = fp16 ? masters[i].to(torch::kHalf).to(torch::kFloat) : masters[i].clone();
    }
  }
  return r;
}

struct EngineRun {
  std::vector<torch::Tensor> weights;  // rank 0's, as fp32 values
  double grad_norm = 0.0;              // get_global_grad_norm() after the last step
  double loss_scale = 0.0;
  int64_t skipped = 0;
};
EngineRun train(const nlohmann::json& config, int steps) {
  EngineRun out;
  std::mutex mu;
  const int accumulation = config["gradient_accumulation_steps"].get<int>();
  dstest::run_ranks(kWorld, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto model = TinyNet();
    auto engine =
        deepspeed::initialize<TinyNetImpl>({.model = model.ptr(), .config_json = config, .comm = comm})
            .engine;
    for (int micro = 0; micro < steps * accumulation; ++micro) {
      auto [x, y] = batch(comm->rank(), micro);
      engine->backward(engine->forward(x, y));
      engine->step();
    }
    const double norm = engine->get_global_grad_norm();
    auto whole = engine->gathered_parameters();  // stage 3: the parameters are partitioned
    std::lock_guard<std::mutex> lock(mu);
    if (comm->rank() != 0) return;
    for (auto& p : model->parameters()) out.weights.push_back(p.detach().to(torch::kFloat).clone());
    out.grad_norm = norm;
    out.loss_scale = engine->loss_scale();
    out.skipped = engine->skipped_steps();
  });
  return out;
}

// SGD without momentum; stage 3 partitions even these small parameters.
nlohmann::json sgd_config(int stage, double lr, int accumulation = 1) {
  auto c = dstest::base_config(kBatch, accumulation, stage);
  c["optimizer"] = {{"type", "SGD"}, {"params", {{"lr", lr}}}};
  if (stage == 3) c["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
  return c;
}

double max_update(const std::vector<torch::Tensor>& after) {
  return dstest::max_abs_diff(after, initial_weights());
}

// How far the engine's weights may be from the reference's. fp32: only summation orders differ
// (measured: at most 1.2e-7). fp16: the engine's gradients are rounded to fp16 (2^-11 relative,
// so the masters differ by about that share of the update) and a weight rounded from masters that
// differ in their last bits may land one fp16 ulp away (measured: one ulp of the largest weight
// at most); two ulps leave room for another machine's BLAS summing in another order.
double tolerance(const Reference& ref, bool fp16) {
  if (!fp16) return 1e-5;
  double biggest = 0.0;
  for (auto& w : ref.weights) biggest = std::max(biggest, w.abs().max().item<double>());
  const double ulp = std::ldexp(1.0, std::ilogb(biggest) - 10);  // fp16 keeps 11 bits
  return 2 * ulp + std::ldexp(max_update(ref.weights), -10);
}
// get_global_grad_norm() against the reference's, relative (measured: 3e-6 in fp16).
double norm_tolerance(bool fp16) { return fp16 ? 1e-3 : 1e-5; }

// Within tolerance() of the reference, which is checked to be under 5% of the reference's
// largest update, so a gradient off by a constant factor (x2, x1/2, x1024) cannot pass.
void expect_matches(const EngineRun& run, const Reference& ref, bool fp16, const std::string& what) {
  ASSERT_EQ(run.weights.size(), ref.weights.size()) << what;
  const double tol = tolerance(ref, fp16);
  ASSERT_LT(tol, 0.05 * max_update(ref.weights)) << what << ": the update is too small to test";
  EXPECT_LT(dstest::max_abs_diff(run.weights, ref.weights), tol)
      << what << ": largest reference update " << max_update(ref.weights) << ", the engine's "
      << max_update(run.weights);
  EXPECT_NEAR(run.grad_norm, ref.last_norm, norm_tolerance(fp16) * ref.last_norm) << what;
}

}  // namespace

// ---- 1. fp16 gradients are divided by the loss scale --------------------------------------------

class GradientMathLossScale : public ::testing::TestWithParam<int> {};

// Multiplying the loss by a power of two multiplies every gradient exactly (fp32 backward, then
// the cast to fp16) as long as nothing leaves fp16's normal range: the reference checks that the
// smallest gradient halved (the mean's g/2) is still normal (>= 2^-14), and a step that overflowed
// would be skipped (checked: none is). Multiplying by 1/S is exact too, so static scales 1 and
// 1024 and dynamic 2^10 must give the same bits.
TEST_P(GradientMathLossScale, WeightsAndNormDoNotDependOnTheScale) {
  const int stage = GetParam();
  const double lr = 0.1;
  const auto ref = reference(2, 1, lr, /*fp16=*/true);
  ASSERT_GT(ref.smallest_rank_gradient / kWorld, 2 * std::pow(2.0, -14)) << "data would underflow";
  std::vector<EngineRun> runs;
  const std::vector<nlohmann::json> fp16_blocks = {
      {{"enabled", true}, {"loss_scale", 1}},
      {{"enabled", true}, {"loss_scale", 1024}},
      {{"enabled", true}, {"initial_scale_power", 10}}};
  for (const auto& fp16 : fp16_blocks) {
    auto config = sgd_config(stage, lr);
    config["fp16"] = fp16;
    runs.push_back(train(config, 2));
    const auto& run = runs.back();
    const std::string what = "stage " + std::to_string(stage) + " fp16 " + fp16.dump();
    EXPECT_EQ(run.skipped, 0) << what;
    EXPECT_EQ(run.loss_scale, fp16.contains("loss_scale") ? fp16["loss_scale"].get<double>() : 1024.0)
        << what;
    // A loss scale left in the update moves the weights 1024x too far (divided twice: 1/1024 of
    // the way); a norm not divided by the scale is 1024x too large; a sum over the ranks instead
    // of their mean doubles both.
    expect_matches(run, ref, /*fp16=*/true, what);
  }
  // Catches a scale applied inexactly (e.g. 1/S rounded, or un-scaled in fp16 after a lossy step),
  // which the tolerance above would hide.
  EXPECT_TRUE(dstest::bit_identical(runs[0].weights, runs[1].weights)) << "stage " << stage;
  EXPECT_TRUE(dstest::bit_identical(runs[0].weights, runs[2].weights)) << "stage " << stage;
  EXPECT_EQ(runs[0].grad_norm, runs[1].grad_norm) << "stage " << stage;
  EXPECT_EQ(runs[0].grad_norm, runs[2].grad_norm) << "stage " << stage;
}

INSTANTIATE_TEST_SUITE_P(GradientMath, GradientMathLossScale, ::testing::Values(0, 1, 2, 3));

// ---- 2. the clipping coefficient -----------------------------------------------------------------

class GradientMathClipping : public ::testing::TestWithParam<std::tuple<int, int, bool>> {};

// SGD with lr 1: w1 = w0 - g * min(1, c / (||g|| + 1e-6)), g the mean gradient over ranks (and
// micro-batches: its norm is the accumulated mean's, not a micro-batch's or the sum's); the norm
// reported is the one before clipping. In fp16 (static scale 1024) the coefficient must come from
// the un-scaled norm: from the scaled one it would shrink the step 1024x more.
TEST_P(GradientMathClipping, OneStepMovesByTheClippedMeanGradient) {
  const auto [stage, accumulation, fp16] = GetParam();
  const double norm = reference(1, accumulation, 1.0, fp16).last_norm;
  // 0.25: the clip binds (unclipped, the step would be 4x as long); 4: it must not (a coefficient
  // c / ||g|| applied without the min would lengthen the step 4x).
  for (double factor : {0.25, 4.0}) {
    const double clip = factor * norm;
    auto config = sgd_config(stage, 1.0, accumulation);
    config["gradient_clipping"] = clip;
    if (fp16) config["fp16"] = {{"enabled", true}, {"loss_scale", 1024}};
    const auto run = train(config, 1);
    const std::string what = "stage " + std::to_string(stage) + " accumulation " +
                             std::to_string(accumulation) + (fp16 ? " fp16" : " fp32") +
                             " clip " + std::to_string(factor) + " x ||g|| (" +
                             std::to_string(norm) + ")";
    EXPECT_EQ(run.skipped, 0) << what;
    expect_matches(run, reference(1, accumulation, 1.0, fp16, clip), fp16, what);
  }
}

INSTANTIATE_TEST_SUITE_P(GradientMath, GradientMathClipping,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(1, 2),
                                            ::testing::Bool()));

// ---- 3. prescale_gradients / gradient_predivide_factor average once ------------------------------

// stage, zero_optimization.reduce_scatter, fp16. Stage 2 with reduce_scatter true refuses both
// keys (a ConfigError, as DeepSpeed's ZeRO-2; tests/unit/config_test.cpp), so it is tested with
// reduce_scatter false only.
class GradientMathAveraging : public ::testing::TestWithParam<std::tuple<int, bool, bool>> {};

TEST_P(GradientMathAveraging, PrescaleAndPredivideAverageExactlyOnce) {
  const auto [stage, reduce_scatter, fp16] = GetParam();
  const double lr = 0.1;
  const auto ref = reference(1, 1, lr, fp16);
  // Averaged twice: half the update; not averaged: twice; predivided and not multiplied back
  // (or multiplied by f twice): a factor f off. With prescale_gradients the factor is not used
  // (DeepSpeed's allreduce_bucket), so the last combination must be the plain mean too.
  for (nlohmann::json extra : {nlohmann::json{{"prescale_gradients", true}},
                               nlohmann::json{{"gradient_predivide_factor", 2.0}},
                               nlohmann::json{{"gradient_predivide_factor", 4.0}},
                               nlohmann::json{{"prescale_gradients", true},
                                              {"gradient_predivide_factor", 4.0}}}) {
    auto config = sgd_config(stage, lr);
    config["zero_optimization"]["reduce_scatter"] = reduce_scatter;
    if (fp16) config["fp16"] = {{"enabled", true}, {"loss_scale", 1024}};
    config.merge_patch(extra);
    const auto run = train(config, 1);
    const std::string what = "stage " + std::to_string(stage) + " reduce_scatter " +
                             std::to_string(reduce_scatter) + (fp16 ? " fp16 " : " fp32 ") +
                             extra.dump();
    EXPECT_EQ(run.skipped, 0) << what;
    expect_matches(run, ref, fp16, what);
  }
}

INSTANTIATE_TEST_SUITE_P(
    GradientMathStage0, GradientMathAveraging,
    ::testing::Combine(::testing::Values(0), ::testing::Values(true), ::testing::Bool()));
INSTANTIATE_TEST_SUITE_P(
    GradientMathStage1, GradientMathAveraging,
    ::testing::Combine(::testing::Values(1), ::testing::Bool(), ::testing::Bool()));
INSTANTIATE_TEST_SUITE_P(
    GradientMathStage2, GradientMathAveraging,
    ::testing::Combine(::testing::Values(2), ::testing::Values(false), ::testing::Bool()));
INSTANTIATE_TEST_SUITE_P(
    GradientMathStage3, GradientMathAveraging,
    ::testing::Combine(::testing::Values(3), ::testing::Values(true), ::testing::Bool()));

}  // namespace gradient_math_test
