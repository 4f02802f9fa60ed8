// A parameter that gets no gradient in a step is treated the same at every ZeRO stage and world
// size, by DeepSpeed-ZeRO's rule: its gradient is zero and the update runs. With AdamW that means
// its Adam moments stay zero (no move from the gradient term) while the decoupled weight decay
// still shrinks it by (1 - lr * weight_decay) per step — at world size 1 exactly as at 3.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "deepspeed/deepspeed.h"
#include "support/ranks.h"
#include "support/training_run.h"

namespace unused_parameter_test {

namespace {

constexpr int kSteps = 12;
constexpr double kLr = 1e-2, kWeightDecay = 0.01;

// A regression net with one parameter the loss never uses.
struct PartlyUsedImpl : torch::nn::Module {
  PartlyUsedImpl() {
    w = register_parameter("w", torch::randn({4, 8}) * 0.3);
    unused = register_parameter("unused", torch::randn({37}) + 1.0);
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
    return (x.matmul(w.t()) - y).pow(2).mean();
  }
  torch::Tensor w, unused;
};
TORCH_MODULE(PartlyUsed);

nlohmann::json config(int stage) {
  return {{"train_micro_batch_size_per_gpu", 4},
          {"gradient_accumulation_steps", 1},
          {"optimizer",
           {{"type", "AdamW"}, {"params", {{"lr", kLr}, {"weight_decay", kWeightDecay}}}}},
          {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 16}}}};
}

// Rank 0's `unused` after kSteps steps.
torch::Tensor train(int world, int stage) {
  std::mutex mu;
  torch::Tensor result;
  std::mutex init;  // ranks are threads sharing libtorch's global generator: seed and draw atomically
  run_ranks(world, [&](deepspeed::comm::CommunicatorPtr comm) {
    PartlyUsed model{nullptr};
    {
      std::lock_guard<std::mutex> lock(init);
      torch::manual_seed(3);
      model = PartlyUsed();
    }
    auto [engine, opt, loader, sched] = deepspeed::initialize<PartlyUsedImpl>(
        {.model = model.ptr(), .config_json = config(stage), .comm = comm});
    for (int s = 0; s < kSteps; ++s) {
      torch::manual_seed(100 * s + comm->rank());
      auto x = torch::randn({4, 8});
      engine->backward(engine->forward(x, x.narrow(1, 0, 4)));
      engine->step();
    }
    torch::Tensor mine;
    {
      auto gathered = engine->gathered_parameters();  // stage 3: whole parameters
      mine = model->unused.detach().clone();
    }
    std::lock_guard<std::mutex> lock(mu);
    if (comm->rank() == 0) result = mine;
  });
  return result;
}

}  // namespace

class UnusedParameter : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(UnusedParameter, ZeroGradientAndTheUpdateRuns) {
  auto [world, stage] = GetParam();
  torch::manual_seed(3);
  auto initial = PartlyUsed()->unused.detach().clone();
  auto trained = train(world, stage);
  // Decoupled decay alone: p * (1 - lr * wd) per step; the moments of a zero gradient are zero.
  auto expected = initial * std::pow(1.0 - kLr * kWeightDecay, kSteps);
  EXPECT_TRUE(torch::allclose(trained, expected, 1e-6, 1e-7))
      << "max |diff| " << (trained - expected).abs().max().item<double>() << ", |sum| "
      << trained.sum().abs().item<double>() << " (untouched would be "
      << initial.sum().abs().item<double>() << ")";
}

INSTANTIATE_TEST_SUITE_P(WorldsAndStages, UnusedParameter,
                         ::testing::Combine(::testing::Values(1, 3), ::testing::Values(0, 1, 2, 3)),
                         [](const auto& info) {
                           return "world" + std::to_string(std::get<0>(info.param)) + "_stage" +
                                  std::to_string(std::get<1>(info.param));
                         });

namespace {

// y = x W^T + b + extra, with `extra` left out unless `use_extra`.
struct ShiftedLinearImpl : torch::nn::Module {
  explicit ShiftedLinearImpl(bool use_extra) : use_extra(use_extra) {
    fc = register_module("fc", torch::nn::Linear(8, 8));
    extra = register_parameter("extra", torch::randn({8}) * 0.1);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto y = torch::tanh(deepspeed::zero::linear(x, fc->weight, fc->bias));
    return use_extra ? y + extra : y;
  }
  torch::nn::Linear fc{nullptr};
  torch::Tensor extra;
  bool use_extra;
};
TORCH_MODULE(ShiftedLinear);

// Three units a, b, c run in that order; a and b are the same size. b's `extra` is used on rank 0
// only, so b's gradients are complete on rank 0 before a's, and on the other ranks never.
struct RankDependentImpl : torch::nn::Module {
  explicit RankDependentImpl(int rank) {
    using deepspeed::ZeroUnit;
    a = register_module("a", std::make_shared<ZeroUnit<ShiftedLinear>>(ShiftedLinear(true)));
    b = register_module("b", std::make_shared<ZeroUnit<ShiftedLinear>>(ShiftedLinear(rank == 0)));
    c = register_module("c",
                        std::make_shared<ZeroUnit<torch::nn::Linear>>(torch::nn::Linear(8, 4)));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
    return (c->forward(b->forward(a->forward(x))) - y).pow(2).mean();
  }
  std::shared_ptr<deepspeed::ZeroUnit<ShiftedLinear>> a, b;
  std::shared_ptr<deepspeed::ZeroUnit<torch::nn::Linear>> c;
};

// Rank 0's parameters after kSteps steps on two ranks.
std::vector<torch::Tensor> train_rank_dependent(int stage) {
  std::mutex mu, init;
  std::vector<torch::Tensor> result;
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    std::shared_ptr<RankDependentImpl> model;
    {
      std::lock_guard<std::mutex> lock(init);
      torch::manual_seed(5);
      model = std::make_shared<RankDependentImpl>(comm->rank());
    }
    auto config = nlohmann::json{{"train_micro_batch_size_per_gpu", 4},
                                 {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", kLr}}}}},
                                 {"zero_optimization", {{"stage", stage}}}};
    if (stage == 3) config["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
    auto engine = deepspeed::initialize<RankDependentImpl>(
                      {.model = model, .config_json = config, .comm = comm})
                      .engine;
    for (int s = 0; s < kSteps; ++s) {
      // A generator of the rank's own: the runs compared must see the same batches.
      auto gen = at::make_generator<at::CPUGeneratorImpl>(100 * s + comm->rank() + 1);
      auto x = torch::randn({4, 8}, gen);
      engine->backward(engine->forward(x, x.narrow(1, 0, 4)));
      engine->step();
    }
    std::vector<torch::Tensor> mine;
    {
      auto gathered = engine->gathered_parameters();
      for (auto& p : model->parameters()) mine.push_back(p.detach().clone());
    }
    std::lock_guard<std::mutex> lock(mu);
    if (comm->rank() == 0) result = mine;
  });
  return result;
}

}  // namespace

// A parameter used on some ranks only: its bucket is complete on those ranks before an earlier
// bucket, on the others only at the end of backward. Every rank must still reduce the buckets in
// one order, or a bucket is summed with another rank's bucket of the same size (stage 3 used to
// launch each bucket as soon as it was complete: the units' gradients were summed crosswise).
// (The first step gathers the units again in backward, between the reduce-scatters, at another
// place on each rank: this passes because the ranks' reduce-scatters go through shared memory;
// over Gloo's TCP pairs alone, DS_SHM_ALLREDUCE=0, they time out: docs/zero3.md, Limits.)
class RankDependentUse : public ::testing::TestWithParam<int> {};

TEST_P(RankDependentUse, SameWeightsAsStageZero) {
  auto reference = train_rank_dependent(0);
  auto trained = train_rank_dependent(GetParam());
  EXPECT_LT(dstest::max_abs_diff(trained, reference), dstest::kWeightTol);
}

INSTANTIATE_TEST_SUITE_P(Stages, RankDependentUse, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return "stage" + std::to_string(info.param); });

}  // namespace unused_parameter_test
