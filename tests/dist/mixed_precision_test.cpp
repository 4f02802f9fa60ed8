// bf16 and fp16 training at ZeRO stages 0-3 over ranks as threads:
//  - bf16 GPT training tracks the fp32 loss curve (50 steps, 2 ranks);
//  - model-state bytes match the ZeRO paper's mixed-precision formulas;
//  - fp16 with dynamic loss scaling trains a model that computes in fp32 internally (libtorch 1.13
//    has no Half matmul on CPU), skipping the overflowing first steps as DeepSpeed does;
//  - an inf injected on one rank skips the step on every rank and leaves weights and optimizer
//    states bit-identical.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <mutex>

#include <torch/torch.h>

#include "deepspeed/engine.h"
#include "deepspeed/memory.h"
#include "precision/loss_scaler.h"
#include "runtime/engine_state.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/half_mlp.h"
#include "support/ranks.h"
#include "support/training_run.h"
#include "util/torch_compat.h"

namespace mixed_precision_test {

namespace {

// bf16 keeps 8 significant bits, so single steps drift apart (measured up to 6.5% on one batch
// over 50 steps of the small GPT) while the curve itself stays together: the mean loss of every
// window of 10 steps must be within 2% of fp32's, and no single step more than 10% off.
constexpr int kWindow = 10;
constexpr double kBf16WindowTolerance = 0.02;
constexpr double kBf16StepTolerance = 0.10;

double worst_window_rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0.0;
  for (size_t w = 0; w + kWindow <= std::min(a.size(), b.size()); w += kWindow) {
    double sa = 0, sb = 0;
    for (size_t i = w; i < w + kWindow; ++i) sa += a[i], sb += b[i];
    worst = std::max(worst, std::abs(sa - sb) / std::abs(sb));
  }
  return worst;
}

dstest::RunResult fp32_reference(int steps) {
  static std::map<int, dstest::RunResult> cache;
  auto it = cache.find(steps);
  if (it != cache.end()) return it->second;
  dstest::RunSpec s;
  s.world_size = 2;
  s.steps = steps;
  s.config = dstest::base_config(4, 1, 0);
  return cache[steps] = dstest::train_gpt(s);
}

// The mixed-precision formulas (Adam, Ψ parameters, N ranks): 2Ψ 16-bit weights, 2Ψ 16-bit
// gradients, 12Ψ fp32 master + moments, partitioned by the stage.
double mixed_bytes(int stage, double psi, int n) {
  switch (stage) {
    case 0: return 16 * psi;
    case 1:  // one micro-step: stage 1 scatters into a partition as stage 2 (memory.h)
    case 2: return 2 * psi + 14 * psi / n;
    default: return 16 * psi / n;
  }
}

}  // namespace

class Bf16Training : public ::testing::TestWithParam<int> {};

TEST_P(Bf16Training, TracksTheFp32LossCurveAndMatchesTheMemoryFormula) {
  const int stage = GetParam();
  const int steps = 50;
  dstest::RunSpec s;
  s.world_size = 2;
  s.steps = steps;
  s.config = dstest::base_config(4, 1, stage);
  s.config["bf16"] = {{"enabled", true}};
  if (stage == 3) s.config["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
  auto bf16 = dstest::train_gpt(s);
  auto fp32 = fp32_reference(steps);
  ASSERT_EQ(bf16.losses.size(), static_cast<size_t>(steps));
  for (auto& w : bf16.weights) ASSERT_EQ(w.scalar_type(), torch::kBFloat16);
  double worst_step = dstest::max_loss_rel_diff(bf16, fp32);
  double worst_window = worst_window_rel_diff(bf16.losses, fp32.losses);
  EXPECT_LT(worst_window, kBf16WindowTolerance) << "stage " << stage;
  EXPECT_LT(worst_step, kBf16StepTolerance) << "stage " << stage;
  std::printf("stage %d: bf16 vs fp32 over %d steps: worst %d-step window %.4f, worst step %.4f "
              "(first %.4f/%.4f, last %.4f/%.4f)\n",
              stage, steps, kWindow, worst_window, worst_step, bf16.losses.front(),
              fp32.losses.front(), bf16.losses.back(), fp32.losses.back());
  EXPECT_LT(bf16.losses.back(), 0.8 * bf16.losses.front());

  const double psi = static_cast<double>(dstest::count_parameters(s.model));
  for (int rank = 0; rank < 2; ++rank) {
    const auto& m = bf16.memory[rank];
    double want = mixed_bytes(stage, psi, 2);
    EXPECT_NEAR(m.model_states(), want, 0.05 * want)
        << "stage " << stage << " rank " << rank << ": params " << m.parameters << " grads "
        << m.gradients << " optimizer " << m.optimizer_states;
    auto e = deepspeed::estimate_zero_memory(static_cast<int64_t>(psi), 2, stage, true);
    EXPECT_NEAR(m.model_states(), e.model_states(), 0.05 * e.model_states());
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, Bf16Training, ::testing::Values(0, 1, 2, 3));

TEST(Bf16Memory, FourRanksMatchTheFormula) {
  for (int stage : {1, 2, 3}) {
    dstest::RunSpec s;
    s.world_size = 4;
    s.steps = 2;
    s.config = dstest::base_config(2, 1, stage);
    s.config["bf16"] = {{"enabled", true}};
    auto r = dstest::train_gpt(s);
    const double psi = static_cast<double>(dstest::count_parameters(s.model));
    double want = mixed_bytes(stage, psi, 4);
    for (int rank = 0; rank < 4; ++rank)
      EXPECT_NEAR(r.memory[rank].model_states(), want, 0.05 * want) << "stage " << stage;
  }
}

// bf16 at stage 0 accumulates the micro-steps in fp32 (data_types.grad_accum_dtype's default
// there, DeepSpeed's BF16_Optimizer): with gradient_accumulation_steps 2 its gradients are 4Ψ,
// and model_states() is 18Ψ, not 16Ψ. The estimate told that width (grad_accum_bytes 4, as
// memory.h says initialize() resolves it) matches the measurement.
TEST(Bf16Memory, Stage0AccumulatingInFp32MatchesTheEstimate) {
  dstest::RunSpec s;
  s.world_size = 2;
  s.steps = 2;
  s.config = dstest::base_config(2, 2, 0);
  s.config["bf16"] = {{"enabled", true}};
  auto r = dstest::train_gpt(s);
  const int64_t psi = dstest::count_parameters(s.model);
  const auto e = deepspeed::estimate_zero_memory(psi, 2, 0, true, 1, 0, /*grad_accum_bytes=*/4);
  EXPECT_EQ(e.model_states(), 18 * psi);
  for (int rank = 0; rank < 2; ++rank) {
    const auto& m = r.memory[rank];
    EXPECT_NEAR(m.model_states(), e.model_states(), 0.05 * e.model_states())
        << "rank " << rank << ": params " << m.parameters << " grads " << m.gradients
        << " optimizer " << m.optimizer_states;
  }
}

// communication_data_type fp32 and data_types.grad_accum_dtype fp32 change only the rounding.
TEST(Bf16Training, Fp32CommunicationAndAccumulationTrackToo) {
  for (int stage : {1, 2}) {
    dstest::RunSpec s;
    s.world_size = 2;
    s.steps = 20;
    s.config = dstest::base_config(2, 2, stage);
    s.config["bf16"] = {{"enabled", true}};
    s.config["communication_data_type"] = "fp32";
    s.config["data_types"] = {{"grad_accum_dtype", "fp32"}};
    auto wide = dstest::train_gpt(s);
    s.config = dstest::base_config(2, 2, 0);
    auto fp32 = dstest::train_gpt(s);
    EXPECT_LT(worst_window_rel_diff(wide.losses, fp32.losses), kBf16WindowTolerance)
        << "stage " << stage;
    EXPECT_LT(dstest::max_loss_rel_diff(wide, fp32), kBf16StepTolerance) << "stage " << stage;
  }
}

// A client optimizer with 16-bit training steps the fp32 master partition (issue 13: DeepSpeed
// re-points the client's groups at its fp32 partitions); it used to be refused here.
TEST(MixedPrecisionConfig, ClientOptimizerStepsTheFp32Masters) {
  auto model = std::make_shared<gpt::GPTImpl>(gpt::GPTConfig{256, 16, 1, 2, 16});
  auto opt = std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1));
  auto config = dstest::base_config(2, 1, 0);
  config["bf16"] = {{"enabled", true}};
  auto r = deepspeed::initialize<gpt::GPTImpl>({.model = model, .config_json = config, .optimizer = opt});
  EXPECT_EQ(r.optimizer.get(), opt.get());
  ASSERT_EQ(opt->param_groups()[0].params().size(), 1u);
  EXPECT_EQ(opt->param_groups()[0].params()[0].scalar_type(), torch::kFloat);
}

// ---- fp16 --------------------------------------------------------------------------------------

namespace {

using dstest::HalfMlp;
using dstest::HalfMlpImpl;

nlohmann::json fp16_config(int stage, nlohmann::json fp16) {
  auto c = dstest::base_config(8, 1, stage);
  c["optimizer"]["params"]["lr"] = 1e-2;
  c["fp16"] = std::move(fp16);
  c["fp16"]["enabled"] = true;
  return c;
}

struct RankSnapshot {
  std::vector<torch::Tensor> weights;  // the module's fp16 parameters
  std::vector<torch::Tensor> states;   // fp32 masters and both moments of the rank's partition
};
RankSnapshot snapshot(deepspeed::Engine& engine) {
  RankSnapshot s;
  for (auto& p : engine.module().parameters()) s.weights.push_back(p.detach().clone());
  auto& opt = *engine.optimizer();
  for (auto& g : opt.param_groups())
    for (auto& p : g.params()) {
      s.states.push_back(p.detach().clone());
      auto key = deepspeed::compat::optimizer_state_key(p);
      auto& st = static_cast<torch::optim::AdamWParamState&>(*opt.state().at(key));
      s.states.push_back(st.exp_avg().clone());
      s.states.push_back(st.exp_avg_sq().clone());
    }
  return s;
}
using dstest::bit_identical;

}  // namespace

class Fp16Training : public ::testing::TestWithParam<int> {};

// No dynamic key given: under ZeRO DeepSpeed starts at 2^32, which overflows fp16 at once; the
// scaler halves it on each overflow until the gradients fit, then training proceeds. Stage 0
// (FP16_Optimizer's defaults start at 2^16, which fits) is given 2^32 explicitly.
TEST_P(Fp16Training, DynamicScalingSkipsOverflowsAndTheLossFalls) {
  const int stage = GetParam();
  std::mutex mu;
  std::vector<double> losses;
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    torch::manual_seed(5);
    auto model = HalfMlp();
    auto [engine, opt, loader, sched] = deepspeed::initialize<HalfMlpImpl>(
        {.model = model.ptr(),
         .config_json = fp16_config(stage, stage == 0 ? nlohmann::json{{"initial_scale_power", 32}}
                                                      : nlohmann::json::object()),
         .comm = comm});
    for (auto& p : model->parameters()) ASSERT_EQ(p.scalar_type(), torch::kHalf);
    const double initial_scale = engine->loss_scale();
    std::vector<double> mine;
    for (int64_t step = 0; step < 80; ++step) {
      auto b = dstest::half_mlp_batch(comm->rank(), step);
      engine->backward(engine->forward(b.x, b.y));
      engine->step();
      if (engine->was_step_applied()) mine.push_back(engine->last_loss());
    }
    EXPECT_GT(engine->skipped_steps(), 0);
    EXPECT_LT(engine->loss_scale(), initial_scale);
    EXPECT_EQ(engine->global_steps(), 80);
    std::lock_guard<std::mutex> lock(mu);
    if (comm->rank() == 0) losses = mine;
  });
  ASSERT_GT(losses.size(), 40u);
  EXPECT_LT(losses.back(), 0.5 * losses.front())
      << "first applied loss " << losses.front() << ", last " << losses.back();
}

// An inf in one rank's gradients: every rank skips, nothing changes, the scale halves.
TEST_P(Fp16Training, InfOnOneRankSkipsTheStepEverywhereBitIdentically) {
  const int stage = GetParam();
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    torch::manual_seed(5);
    auto model = HalfMlp();
    auto config = fp16_config(stage, {{"initial_scale_power", 8}, {"hysteresis", 1}});
    config["scheduler"] = {{"type", "WarmupLR"},
                           {"params", {{"warmup_num_steps", 10}, {"warmup_type", "linear"}}}};
    auto [engine, opt, loader, sched] = deepspeed::initialize<HalfMlpImpl>(
        {.model = model.ptr(), .config_json = config, .comm = comm});
    auto train_step = [&](int64_t step, bool poison) {
      auto b = dstest::half_mlp_batch(comm->rank(), step);
      auto loss = engine->forward(b.x, b.y);
      if (poison) loss = loss * std::numeric_limits<float>::infinity();
      engine->backward(loss);
      engine->step();
    };
    for (int64_t step = 0; step < 3; ++step) train_step(step, false);
    ASSERT_TRUE(engine->was_step_applied());
    ASSERT_EQ(engine->skipped_steps(), 0);
    const double scale = engine->loss_scale();
    const auto lr = engine->get_lr();
    auto before = snapshot(*engine);

    train_step(3, /*poison=*/comm->rank() == 1);
    EXPECT_FALSE(engine->was_step_applied()) << "rank " << comm->rank();
    EXPECT_EQ(engine->skipped_steps(), 1);
    EXPECT_EQ(engine->global_steps(), 4);
    EXPECT_EQ(engine->loss_scale(), scale / 2);
    EXPECT_EQ(engine->get_lr(), lr);
    auto after = snapshot(*engine);
    EXPECT_TRUE(bit_identical(before.weights, after.weights)) << "rank " << comm->rank();
    EXPECT_TRUE(bit_identical(before.states, after.states)) << "rank " << comm->rank();

    train_step(4, false);  // the next clean step applies again
    EXPECT_TRUE(engine->was_step_applied());
    EXPECT_FALSE(bit_identical(before.weights, snapshot(*engine).weights));
  });
}

INSTANTIATE_TEST_SUITE_P(Stages, Fp16Training, ::testing::Values(0, 1, 2, 3));

namespace {
// Every gradient element is 40000 (fp16's largest finite value is 65504) on every rank.
struct LargeGradientImpl : torch::nn::Module {
  LargeGradientImpl() { w = register_parameter("w", torch::zeros({8})); }
  torch::Tensor forward(const torch::Tensor& x) { return (w.to(torch::kFloat) * x).sum(); }
  torch::Tensor w;
};
}  // namespace

class Fp16GradientMean : public ::testing::TestWithParam<int> {};

// The mean of two ranks' fp16 gradients of 40000 is 40000; their sum (80000) is not an fp16
// value. DeepSpeed divides each gradient by the world size before the reduction, so a static
// loss scale that fits the mean never overflows; every stage must agree (the reduce-scatters of
// stages 2 and 3 once wrote the sum into the fp16 bucket before dividing: inf, a skipped step).
TEST_P(Fp16GradientMean, AMeanThatFitsInFp16DoesNotOverflow) {
  const int stage = GetParam();
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto model = std::make_shared<LargeGradientImpl>();
    auto engine = deepspeed::initialize<LargeGradientImpl>(
                      {.model = model, .config_json = fp16_config(stage, {{"loss_scale", 1}}),
                       .comm = comm})
                      .engine;
    engine->backward(engine->forward(torch::full({8}, 40000.0)));
    engine->step();
    EXPECT_TRUE(engine->was_step_applied()) << "stage " << stage << " rank " << comm->rank();
    EXPECT_EQ(engine->skipped_steps(), 0);
    EXPECT_NEAR(engine->get_global_grad_norm(), 40000.0 * std::sqrt(8.0), 1.0);
  });
}

INSTANTIATE_TEST_SUITE_P(Stages, Fp16GradientMean, ::testing::Values(0, 1, 2, 3));

// fp16.auto_cast: floating-point inputs reach the model as fp16, integer inputs unchanged.
namespace {
struct DtypeProbeImpl : torch::nn::Module {
  DtypeProbeImpl() { w = register_parameter("w", torch::ones({4})); }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& ids) {
    seen_x = x.scalar_type();
    seen_ids = ids.scalar_type();
    return (x.to(torch::kFloat) * w.to(torch::kFloat)).sum();
  }
  torch::Tensor w;
  at::ScalarType seen_x = at::kFloat, seen_ids = at::kFloat;
};
}  // namespace

TEST(Fp16Config, AutoCastCastsFloatingInputsOnly) {
  for (bool auto_cast : {false, true}) {
    auto model = std::make_shared<DtypeProbeImpl>();
    auto config = fp16_config(0, {{"auto_cast", auto_cast}});
    auto engine = deepspeed::initialize<DtypeProbeImpl>({.model = model, .config_json = config}).engine;
    engine->forward(torch::ones({4}), torch::zeros({2}, torch::kLong));
    EXPECT_EQ(model->seen_x, auto_cast ? torch::kHalf : torch::kFloat);
    EXPECT_EQ(model->seen_ids, torch::kLong);
  }
}

namespace {
// libtorch's SGD whose first step fails (a step that throws after the overflow vote: an
// out-of-memory in the update, say).
struct FailsOnceSgd : torch::optim::SGD {
  using torch::optim::SGD::SGD;
  bool failed = false;
  torch::Tensor step(LossClosure closure) override {
    if (!failed) {
      failed = true;
      TORCH_CHECK(false, "simulated failure in the update");
    }
    return torch::optim::SGD::step(std::move(closure));
  }
};
}  // namespace

// The dynamic loss scaler counts a step once the stage has applied it: a step that threw in the
// update and is called again counts once in loss_scale_window (before, the scale doubled a step
// early), and reports its micro-step's loss (before, 0: the first attempt had dropped it).
TEST(Fp16LossScaler, AStepThatThrewInTheUpdateCountsOnceInTheScaleWindow) {
  at::set_num_threads(1);
  torch::manual_seed(5);
  auto model = HalfMlp();
  auto config = fp16_config(1, {{"initial_scale_power", 8}, {"loss_scale_window", 2}});
  config.erase("optimizer");
  auto sgd = std::make_shared<FailsOnceSgd>(model->parameters(), torch::optim::SGDOptions(1e-2));
  auto engine = deepspeed::initialize<HalfMlpImpl>(
                    {.model = model.ptr(), .config_json = config, .optimizer = sgd})
                    .engine;
  auto b = dstest::half_mlp_batch(0, 0);
  const double forward_loss = engine->forward(b.x, b.y).item<double>();
  engine->backward(engine->forward(b.x, b.y));
  EXPECT_THROW(engine->step(), deepspeed::Error);
  EXPECT_EQ(engine->loss_scale(), 256.0);
  engine->step();  // the same gradients, applied now
  EXPECT_TRUE(engine->was_step_applied());
  EXPECT_NEAR(engine->last_loss(), forward_loss, 1e-6) << "the retried step lost its loss";
  EXPECT_EQ(engine->loss_scale(), 256.0) << "the failed attempt was counted in the window";
  b = dstest::half_mlp_batch(0, 1);
  engine->backward(engine->forward(b.x, b.y));
  engine->step();
  EXPECT_EQ(engine->loss_scale(), 512.0) << "two applied steps fill a window of 2";
}

namespace {

std::shared_ptr<deepspeed::ModelEngine<HalfMlpImpl>> half_mlp_engine(const nlohmann::json& config) {
  torch::manual_seed(5);
  return deepspeed::initialize<HalfMlpImpl>({.model = HalfMlp().ptr(), .config_json = config})
      .engine;
}

void train_half_mlp(deepspeed::ModelEngine<HalfMlpImpl>& engine, int steps) {
  for (int i = 0; i < steps; ++i) {
    auto b = dstest::half_mlp_batch(0, i);
    engine.backward(engine.forward(b.x, b.y));
    engine.step();
  }
}

}  // namespace

// The saved loss scaler is fp16's state: it is taken only from an fp16 checkpoint into an fp16
// engine. Before, a bf16/fp32 checkpoint's static 1 replaced an fp16 engine's dynamic scaler (its
// gradients underflow), and an fp16 checkpoint gave a bf16 engine a scale that kept growing.
TEST(Fp16LossScaler, ACheckpointOfAnotherPrecisionLeavesTheEngineItsOwnScaler) {
  at::set_num_threads(1);
  dstest::TempDir dir;
  auto fp16 = [](int power) {
    return fp16_config(1, {{"initial_scale_power", power}, {"loss_scale_window", 1}});
  };
  auto fp32 = dstest::base_config(8, 1, 1);
  auto bf16 = fp32;
  bf16["bf16"] = {{"enabled", true}};

  auto from_fp32 = half_mlp_engine(fp32);
  train_half_mlp(*from_fp32, 1);
  from_fp32->save_checkpoint(dir / "fp32");
  auto into_fp16 = half_mlp_engine(fp16(8));
  into_fp16->load_checkpoint(dir / "fp32");
  EXPECT_EQ(into_fp16->loss_scale(), 256.0) << "an fp32 checkpoint replaced the dynamic scaler";

  auto from_fp16 = half_mlp_engine(fp16(8));
  train_half_mlp(*from_fp16, 2);  // a window of 1: the scale doubles after each applied step
  const double grown = from_fp16->loss_scale();
  ASSERT_GT(grown, 256.0);
  from_fp16->save_checkpoint(dir / "fp16");
  auto into_bf16 = half_mlp_engine(bf16);
  into_bf16->load_checkpoint(dir / "fp16");
  EXPECT_EQ(into_bf16->loss_scale(), 1.0) << "an fp16 checkpoint gave a bf16 engine its scale";
  auto into_other_fp16 = half_mlp_engine(fp16(4));
  into_other_fp16->load_checkpoint(dir / "fp16");
  EXPECT_EQ(into_other_fp16->loss_scale(), grown) << "fp16 into fp16 resumes the saved scale";
  // DeepSpeed keeps the scaler in the optimizer's state: loading without it keeps the engine's.
  auto weights_only = half_mlp_engine(fp16(4));
  weights_only->load_checkpoint(dir / "fp16", "", true, /*load_optimizer_states=*/false);
  EXPECT_EQ(weights_only->loss_scale(), 16.0) << "the scaler came without the optimizer state";
}

// Without ZeRO, DeepSpeed wraps FusedAdam (Adam/AdamW) and the 1-bit Adams in FP16_Optimizer
// (default floor 1) and every other optimizer in FP16_UnfusedOptimizer (default floor 0.25).
TEST(Fp16LossScaler, StageZeroFloorFollowsTheOptimizerWrapper) {
  at::set_num_threads(1);
  auto min_scale_of = [](nlohmann::json config, std::shared_ptr<torch::optim::Optimizer> client = {},
                         HalfMlp model = HalfMlp()) {
    auto engine = deepspeed::initialize<HalfMlpImpl>(
                      {.model = model.ptr(), .config_json = config, .optimizer = client})
                      .engine;
    auto& scaler = dynamic_cast<deepspeed::precision::DynamicLossScaler&>(
        *deepspeed::state_of(*engine).loss_scaler);
    return scaler.min_scale();
  };
  auto with = [](nlohmann::json optimizer) {
    auto c = fp16_config(0, nlohmann::json::object());
    c["optimizer"] = std::move(optimizer);
    return c;
  };
  EXPECT_EQ(min_scale_of(with({{"type", "Adam"}, {"params", {{"lr", 1e-3}}}})), 1.0);
  EXPECT_EQ(min_scale_of(with({{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}})), 1.0);
  EXPECT_EQ(min_scale_of(with({{"type", "SGD"}, {"params", {{"lr", 1e-3}}}})), 0.25);
  EXPECT_EQ(min_scale_of(with({{"type", "Adam"}, {"params", {{"lr", 1e-3}, {"torch_adam", true}}}})),
            0.25);
  HalfMlp model;
  auto client_config = with({{"type", "Adam"}});
  client_config.erase("optimizer");
  auto sgd = std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(1e-2));
  EXPECT_EQ(min_scale_of(client_config, sgd, model), 0.25);
  EXPECT_EQ(min_scale_of(fp16_config(1, nlohmann::json::object())), 1.0) << "ZeRO's own default";
}

}  // namespace mixed_precision_test
