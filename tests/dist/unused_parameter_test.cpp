// A parameter that gets no gradient in a step is treated the same at every ZeRO stage and world
// size, by DeepSpeed-ZeRO's rule: its gradient is zero and the update runs. With AdamW that means
// its Adam moments stay zero (no move from the gradient term) while the decoupled weight decay
// still shrinks it by (1 - lr * weight_decay) per step — at world size 1 exactly as at 3.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>

#include <torch/torch.h>

#include "deepspeed/deepspeed.h"
#include "support/ranks.h"

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
