// ZeRO-3's gatherer after a gather that threw (an out-of-memory for a unit's buffer): the unit is
// left neither counted as in use nor pinned, so a retried forward, the steps after it and a
// whole-model read all see the weights the steps made, as in a run that never failed. Before, a
// unit whose gather threw inside its forward scope stayed "in use" for ever: never released, so
// never regathered after a step, and trained on stale weights silently.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/deepspeed.h"
#include "deepspeed/zero_unit.h"
#include "support/failing_cpu_allocator.h"

namespace stage3_failed_gather_test {

namespace {

// Two units of one 700 x 700 weight each: a unit's gathered buffer (1.9 MiB) is the only
// allocation above 1.5 MiB in a forward.
struct TwoUnitsImpl : torch::nn::Module {
  std::shared_ptr<deepspeed::ZeroUnit<torch::nn::Linear>> a, b;
  TwoUnitsImpl() {
    auto layer = [] { return torch::nn::Linear(torch::nn::LinearOptions(700, 700).bias(false)); };
    a = register_module("a", std::make_shared<deepspeed::ZeroUnit<torch::nn::Linear>>(layer()));
    b = register_module("b", std::make_shared<deepspeed::ZeroUnit<torch::nn::Linear>>(layer()));
  }
  torch::Tensor forward(const torch::Tensor& x) { return b->forward(a->forward(x)).pow(2).mean(); }
};

constexpr size_t kFailAbove = 3 << 19;  // 1.5 MiB

// Three steps on fixed inputs; `before_step1` runs just before step 1's forward.
std::vector<std::pair<std::string, at::Tensor>> train(
    const std::function<void(deepspeed::ModelEngine<TwoUnitsImpl>&)>& before_step1) {
  at::set_num_threads(1);
  torch::manual_seed(3);
  auto model = std::make_shared<TwoUnitsImpl>();
  nlohmann::json config = {
      {"train_micro_batch_size_per_gpu", 2},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-2}}}}},
      {"zero_optimization",
       {{"stage", 3}, {"stage3_param_persistence_threshold", 0}, {"stage3_prefetch_bucket_size", 0}}}};
  auto engine = deepspeed::initialize<TwoUnitsImpl>({.model = model, .config_json = config}).engine;
  for (int step = 0; step < 3; ++step) {
    if (step == 1) before_step1(*engine);
    torch::manual_seed(100 + step);
    at::Tensor x = torch::randn({2, 700});
    engine->backward(engine->forward(x));
    engine->step();
  }
  return engine->consolidated_state_dict();
}

void expect_same(const std::vector<std::pair<std::string, at::Tensor>>& got,
                 const std::vector<std::pair<std::string, at::Tensor>>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_TRUE(torch::equal(got[i].second, want[i].second)) << want[i].first;
}

}  // namespace

TEST(Stage3FailedGather, AForwardWhoseGatherThrewIsRetriedOnTheStepsWeights) {
  auto clean = train([](auto&) {});
  auto retried = train([](deepspeed::ModelEngine<TwoUnitsImpl>& engine) {
    dstest::FailingCpuAllocatorScope failing(kFailAbove);
    failing->arm();
    EXPECT_ANY_THROW(engine.forward(torch::randn({2, 700})));
    failing->disarm();
  });
  expect_same(retried, clean);
}

TEST(Stage3FailedGather, AWholeModelGatherThatThrewPinsNothing) {
  auto clean = train([](auto&) {});
  auto retried = train([](deepspeed::ModelEngine<TwoUnitsImpl>& engine) {
    dstest::FailingCpuAllocatorScope failing(kFailAbove);
    failing->arm();
    EXPECT_ANY_THROW(engine.gathered_parameters());
    failing->disarm();
  });
  expect_same(retried, clean);
}

}  // namespace stage3_failed_gather_test
