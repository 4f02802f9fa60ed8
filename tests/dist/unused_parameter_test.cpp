// A parameter that gets no gradient in a step is treated the same at every ZeRO stage and world
// size, by DeepSpeed-ZeRO's rule: its gradient is zero and the update runs. With AdamW that means
// its Adam moments stay zero (no move from the gradient term) while the decoupled weight decay
// still shrinks it by (1 - lr * weight_decay) per step — at world size 1 exactly as at 3.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "deepspeed/deepspeed.h"
#include "support/expect.h"
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

namespace {

// Square layers of kSide x kSide: one bucket each at reduce_bucket_size kSquare.
constexpr int64_t kSide = 8, kSquare = kSide * kSide, kChain = 8;

// The last square also holds a "pooler" of one bucket that it uses only when told (a pooler, or
// a head, that this loss leaves out).
struct SquareImpl : torch::nn::Module {
  explicit SquareImpl(bool with_pooler) {
    weight = register_parameter("weight", torch::randn({kSide, kSide}) * 0.3);
    if (with_pooler) pooler = register_parameter("pooler", torch::randn({kSquare}) * 0.1);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto y = torch::tanh(deepspeed::zero::linear(x, weight));
    return use_pooler ? y * (1.0 + 1e-2 * pooler.mean()) : y;
  }
  torch::Tensor weight, pooler;
  bool use_pooler = false;
};
TORCH_MODULE(Square);

// kChain squares, each a ZeRO-3 unit. The pooler is registered last, so it lies in the bucket
// every stage reduces first: stages 0-2 lay their buckets in reverse registration order, stage 3
// launches its units last to first.
struct ChainImpl : torch::nn::Module {
  ChainImpl() {
    for (int64_t i = 0; i < kChain; ++i)
      squares.push_back(register_module(
          "square" + std::to_string(i),
          std::make_shared<deepspeed::ZeroUnit<Square>>(Square(i == kChain - 1))));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
    auto h = squares[0]->forward(x);
    if (probe) h.register_hook([this](const torch::Tensor&) { probe(); });
    for (size_t i = 1; i < squares.size(); ++i)
      h = checkpointed && i + 1 < squares.size()
              ? deepspeed::checkpointing::checkpoint(
                    [this, i](const torch::Tensor& in) { return squares[i]->forward(in); }, h)
              : squares[i]->forward(h);
    return (h - y).pow(2).mean();
  }
  void use_pooler(bool on) { squares.back()->inner()->use_pooler = on; }
  std::vector<std::shared_ptr<deepspeed::ZeroUnit<Square>>> squares;
  // Runs in backward when the gradient reaches the first square's output: every later square's
  // gradient is in by then (data dependence; autograd also runs a ready accumulation first).
  std::function<void()> probe;
  bool checkpointed = false;  // the middle squares in activation-checkpointed segments
};

nlohmann::json chain_config(int stage, bool overlap, int accumulation = 1) {
  nlohmann::json z = {{"stage", stage}, {"reduce_bucket_size", kSquare}, {"overlap_comm", overlap}};
  if (stage == 3) z["stage3_param_persistence_threshold"] = 0;
  return {{"train_micro_batch_size_per_gpu", 4},
          {"gradient_accumulation_steps", accumulation},
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", kLr}, {"weight_decay", kWeightDecay}}}}},
          {"zero_optimization", z}};
}

int64_t reductions(const deepspeed::comm::Communicator& comm) {
  int64_t calls = 0;
  for (const auto& [op, st] : comm.stats())
    if (op.rfind("all_reduce", 0) == 0 || op.rfind("reduce_scatter", 0) == 0) calls += st.calls;
  return calls;
}

struct ChainRun {
  std::vector<int64_t> reduced_at_probe;  // rank 0, per micro-step: reductions launched so far
  int64_t comm_buffers = 0;               // rank 0's memory_report() after the last step
  std::vector<torch::Tensor> weights;     // rank 0's, gathered
};

// Two ranks train the chain. `pooler_on(micro_step)`: whether that micro-step's loss uses it.
ChainRun train_chain(const nlohmann::json& config, int steps,
                     const std::function<bool(int)>& pooler_on, bool checkpointed = false) {
  std::mutex mu, init;
  ChainRun run;
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    std::shared_ptr<ChainImpl> model;
    {
      std::lock_guard<std::mutex> lock(init);
      torch::manual_seed(7);
      model = std::make_shared<ChainImpl>();
    }
    model->checkpointed = checkpointed;
    auto engine =
        deepspeed::initialize<ChainImpl>({.model = model, .config_json = config, .comm = comm})
            .engine;
    std::vector<int64_t> at_probe;
    int64_t before = 0;
    model->probe = [&] { at_probe.push_back(reductions(*comm) - before); };
    const int accumulation = config["gradient_accumulation_steps"].get<int>();
    for (int m = 0; m < steps * accumulation; ++m) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(100 * m + comm->rank() + 1);
      auto x = torch::randn({4, kSide}, gen);
      model->use_pooler(pooler_on(m));
      auto loss = engine->forward(x, x.flip({1}));
      before = reductions(*comm);
      engine->backward(loss);
      engine->step();
    }
    std::vector<torch::Tensor> mine;
    {
      auto gathered = engine->gathered_parameters();
      for (auto& p : model->parameters()) mine.push_back(p.detach().clone());
    }
    const int64_t buffers = engine->memory_report().comm_buffers;
    std::lock_guard<std::mutex> lock(mu);
    if (comm->rank() == 0) run = {at_probe, buffers, mine};
  });
  return run;
}

bool never(int) { return false; }

}  // namespace

// A parameter the loss does not use (registered last: it lies in the first bucket) held back
// every later bucket until the end of backward: nothing was reduced while backward ran, and at
// stages 2 and 3 every bucket borrowed a buffer at once (about the whole gradient in buckets,
// ZeRO-2's saving gone). Its bucket now goes as soon as the backward begins (the loss's graph
// cannot reach it), the others as they fill, as they would without the parameter.
class UnusedParameterBuckets : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(UnusedParameterBuckets, DoNotWaitForIt) {
  auto [stage, overlap] = GetParam();
  auto run = train_chain(chain_config(stage, overlap), 3, never);
  ASSERT_EQ(run.reduced_at_probe.size(), 3u);
  for (int64_t n : run.reduced_at_probe)  // the pooler's bucket and the last square's, at least
    EXPECT_GE(n, 2) << "buckets reduced before the backward reached the first square";
  if (stage >= 2) {
    // At most two buckets in flight and one filling (one at a time without overlap_comm); the
    // whole gradient is kChain + 1 buckets.
    const int64_t bucket_bytes = kSquare * 4;
    EXPECT_LE(run.comm_buffers, (overlap ? 3 : 1) * bucket_bytes);
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, UnusedParameterBuckets,
                         ::testing::Values(std::make_tuple(0, true), std::make_tuple(1, true),
                                           std::make_tuple(2, false), std::make_tuple(2, true),
                                           std::make_tuple(3, true)),
                         [](const auto& info) {
                           return "stage" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_overlap" : "");
                         });

// Used on some micro-steps only (odd ones), and so reduced on those and skipped on the others:
// the same weights as stage 0, whose buckets (no overlap_comm) wait for nothing.
class PartlyUsedPooler : public ::testing::TestWithParam<int> {};

TEST_P(PartlyUsedPooler, SameWeightsAsStageZero) {
  auto odd = [](int m) { return m % 2 == 1; };
  auto reference = train_chain(chain_config(0, false, 2), 3, odd);
  auto trained = train_chain(chain_config(GetParam(), true, 2), 3, odd);
  EXPECT_LT(dstest::max_abs_diff(trained.weights, reference.weights), dstest::kWeightTol);
}

INSTANTIATE_TEST_SUITE_P(Stages, PartlyUsedPooler, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return "stage" + std::to_string(info.param); });

// Activation checkpointing: a checkpointed segment's parameters appear in the graph only when
// backward recomputes it, so nothing can be ruled out when the backward begins: the buckets wait
// as before (no parameter is taken for unused and then refused when its gradient comes).
TEST(UnusedParameterCheckpointed, TrainsAsWithoutCheckpointing) {
  for (int stage : {2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    auto plain = train_chain(chain_config(stage, true), 2, never);
    auto checkpointed = train_chain(chain_config(stage, true), 2, never, /*checkpointed=*/true);
    EXPECT_LT(dstest::max_abs_diff(checkpointed.weights, plain.weights), dstest::kWeightTol);
  }
}

// A backward run from inside the engine's (here from a tensor hook) reaches the pooler, which the
// loss's graph did not: its bucket may have gone without it, so its gradient is refused, naming
// why, and left on no parameter.
TEST(UnusedParameterReachedLater, IsRefusedNamingWhy) {
  run_ranks(1, [](deepspeed::comm::CommunicatorPtr comm) {
    torch::manual_seed(7);
    auto model = std::make_shared<ChainImpl>();
    auto engine = deepspeed::initialize<ChainImpl>(
                      {.model = model, .config_json = chain_config(2, true), .comm = comm})
                      .engine;
    auto pooler = model->squares.back()->inner()->pooler;
    model->probe = [&] {
      torch::AutoGradMode grad(true);  // off while autograd runs hooks
      (pooler * 2).sum().backward();
    };
    auto x = torch::randn({4, kSide});
    const std::string msg = dstest::message_of<deepspeed::Error>(
        [&] { engine->backward(engine->forward(x, x.flip({1}))); });
    EXPECT_CONTAINS(msg, "could not give it when backward began");
    EXPECT_FALSE(pooler.grad().defined());
  });
}

}  // namespace unused_parameter_test
