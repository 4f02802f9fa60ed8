// A pipeline stage parameter that some micro-batches of a batch use and the batch's last one does
// not: its gradient is the sum over the micro-batches that used it, at every ZeRO stage the
// pipeline takes (0, 1, 2). Under the pipeline only the last micro-batch's backward runs through
// the ZeRO stage (schedule_interpreter.cpp): the earlier ones accumulate in the parameters' .grad.
// ZeRO-2 takes a gradient into its bucket when the parameter's gradient hook fires, which it does
// only in a backward that uses the parameter; the sum the earlier micro-batches left in .grad must
// be taken too (it once stayed on the parameter: never reduced, never stepped).
// Pipe 2 x data 2 (4 ranks as threads), fp32, compared with ZeRO stage 0 in the same layout.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <mutex>
#include <string>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "deepspeed/pipe.h"
#include "support/ranks.h"

namespace pipeline_unused_test {

namespace dp = deepspeed::pipe;

namespace {

constexpr int kWorld = 4, kStages = 2, kDataRanks = kWorld / kStages, kGas = 4, kSteps = 3;

// tanh(x w^T + b), plus `sometimes` when the micro-batch's marker (its first input element) is
// positive: only the micro-batches that carry the marker use `sometimes`.
struct SometimesBiasImpl : torch::nn::Module {
  SometimesBiasImpl() {
    w = register_parameter("w", torch::randn({16, 16}) * 0.25);
    b = register_parameter("b", torch::zeros({16}));
    sometimes = register_parameter("sometimes", torch::randn({16}) * 0.1);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto y = x.matmul(w.t()) + b;
    if (x[0][0].item<float>() > 0) y = y + sometimes;
    return torch::tanh(y);
  }
  torch::Tensor w, b, sometimes;
};
TORCH_MODULE(SometimesBias);

// Four such layers, "uniform": each stage holds two, stage 0's first reads the marker.
dp::PipelineModule model() {
  dp::PipelineModule m;
  for (int i = 0; i < 4; ++i)
    m.layers.emplace_back("sometimes_bias", [] { return torch::nn::AnyModule(SometimesBias()); });
  m.loss_fn = [](const at::Tensor& out, const at::Tensor& y) { return (out - y).pow(2).mean(); };
  m.num_stages = kStages;
  m.partition_method = "uniform";
  return m;
}

// Micro-batch m of data rank d: marked (first element +1) for every micro-batch but the batch's
// last, whose first element is -1.
dp::MicroBatch micro_batch(int step, int m, int d) {
  auto x = torch::randn({4, 16}, at::make_generator<at::CPUGeneratorImpl>(1000 * step + 10 * m + d));
  x[0][0] = m < kGas - 1 ? 1.0 : -1.0;
  auto teacher = torch::randn({16, 16}, at::make_generator<at::CPUGeneratorImpl>(77)) * 0.5;
  return {x, torch::tanh(x.matmul(teacher))};
}

// Every rank's parameters (by name) after kSteps batches at `zero_stage`.
std::vector<std::map<std::string, at::Tensor>> trained(int zero_stage) {
  std::vector<std::map<std::string, at::Tensor>> params(kWorld);
  run_ranks(kWorld, [&](deepspeed::comm::CommunicatorPtr comm) {
    dp::PipelineInitializeArgs args;
    args.model = model();
    args.config_json = {
        {"train_micro_batch_size_per_gpu", 4},
        {"gradient_accumulation_steps", kGas},
        {"steps_per_print", 0},
        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-2}, {"weight_decay", 0.01}}}}},
        {"zero_optimization", {{"stage", zero_stage}, {"reduce_bucket_size", 100}}},
        {"seed", 5},
    };
    args.comm = comm;
    args.device = "cpu";
    auto engine = dp::initialize_pipeline(args);
    const int d = comm->rank() % kDataRanks;  // data innermost (comm::Grid)
    for (int k = 0; k < kSteps; ++k) {
      int m = 0;
      engine->train_batch([&] { return micro_batch(k, m++, d); });
    }
    for (const auto& item : engine->module().named_parameters())
      params[comm->rank()][item.key()] = item.value().detach().clone();
  });
  return params;
}

}  // namespace

TEST(PipelineUnusedInLastMicroBatch, GetsTheSumOfTheMicroBatchesThatUsedIt) {
  const auto ref = trained(0);
  for (int stage : {1, 2}) {
    const auto run = trained(stage);
    for (int rank = 0; rank < kWorld; ++rank) {
      ASSERT_EQ(run[rank].size(), ref[rank].size());
      bool saw_sometimes = false;
      for (const auto& [name, value] : ref[rank]) {
        saw_sometimes = saw_sometimes || name.find("sometimes") != std::string::npos;
        const at::Tensor& got = run[rank].at(name);
        EXPECT_LT((got - value).abs().max().item<double>(), 1e-5)
            << "ZeRO stage " << stage << ", rank " << rank << ", parameter " << name;
      }
      EXPECT_TRUE(saw_sometimes);
    }
  }
}

}  // namespace pipeline_unused_test
