// A pipeline stage parameter that some micro-batches of a batch use and the batch's last one does
// not: its gradient is the sum over the micro-batches that used it, at every ZeRO stage the
// pipeline takes (0, 1, 2). Under the pipeline only the last micro-batch's backward runs through
// the ZeRO stage (schedule_interpreter.cpp): the earlier ones accumulate in the parameters' .grad.
// ZeRO-2 takes a gradient into its bucket when the parameter's gradient hook fires, which it does
// only in a backward that uses the parameter; the sum the earlier micro-batches left in .grad must
// be taken too (it once stayed on the parameter: never reduced, never stepped).
// Pipe 2 x data 2 (4 ranks as threads), fp32, compared with ZeRO stage 0 in the same layout.
// zero_optimization.ignore_unused_parameters false under the pipeline: such a parameter passes
// (an earlier micro-batch used it); one that no micro-batch of the batch used fails its stage's
// step, naming it.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <mutex>
#include <string>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "deepspeed/errors.h"
#include "deepspeed/pipe.h"
#include "support/expect.h"
#include "support/ranks.h"

namespace pipeline_unused_test {

namespace dp = deepspeed::pipe;

namespace {

constexpr int kWorld = 4, kStages = 2, kDataRanks = kWorld / kStages, kGas = 4, kSteps = 3;

// tanh(x w^T + b), plus `sometimes` when the micro-batch's marker (its first input element) is
// positive: only the micro-batches that carry the marker use `sometimes`.
// With `reads_marker` false the layer always adds `sometimes`.
struct SometimesBiasImpl : torch::nn::Module {
  explicit SometimesBiasImpl(bool reads_marker = true) : reads_marker(reads_marker) {
    w = register_parameter("w", torch::randn({16, 16}) * 0.25);
    b = register_parameter("b", torch::zeros({16}));
    sometimes = register_parameter("sometimes", torch::randn({16}) * 0.1);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto y = x.matmul(w.t()) + b;
    if (!reads_marker || x[0][0].item<float>() > 0) y = y + sometimes;
    return torch::tanh(y);
  }
  bool reads_marker;
  torch::Tensor w, b, sometimes;
};
TORCH_MODULE(SometimesBias);

// Four such layers, "uniform": each stage holds two, stage 0's first reads the marker (with
// `only_first_reads_marker`, the others always add `sometimes`).
dp::PipelineModule model(bool only_first_reads_marker = false) {
  dp::PipelineModule m;
  for (int i = 0; i < 4; ++i) {
    const bool reads = i == 0 || !only_first_reads_marker;
    m.layers.emplace_back("sometimes_bias",
                          [reads] { return torch::nn::AnyModule(SometimesBias(reads)); });
  }
  m.loss_fn = [](const at::Tensor& out, const at::Tensor& y) { return (out - y).pow(2).mean(); };
  m.num_stages = kStages;
  m.partition_method = "uniform";
  return m;
}

// Micro-batch m of data rank d: marked (first element +1) for every micro-batch but the batch's
// last, whose first element is -1.
// `never_marked`: every micro-batch's first element -1 (no micro-batch uses stage 0's first
// `sometimes`).
dp::MicroBatch micro_batch(int step, int m, int d, bool never_marked = false) {
  auto x = torch::randn({4, 16}, at::make_generator<at::CPUGeneratorImpl>(1000 * step + 10 * m + d));
  x[0][0] = m < kGas - 1 && !never_marked ? 1.0 : -1.0;
  auto teacher = torch::randn({16, 16}, at::make_generator<at::CPUGeneratorImpl>(77)) * 0.5;
  return {x, torch::tanh(x.matmul(teacher))};
}

nlohmann::json config(int zero_stage, bool ignore_unused_parameters = true) {
  return {
      {"train_micro_batch_size_per_gpu", 4},
      {"gradient_accumulation_steps", kGas},
      {"steps_per_print", 0},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-2}, {"weight_decay", 0.01}}}}},
      {"zero_optimization",
       {{"stage", zero_stage},
        {"reduce_bucket_size", 100},
        {"ignore_unused_parameters", ignore_unused_parameters}}},
      {"seed", 5},
  };
}

std::shared_ptr<dp::PipelineEngine> engine_of(deepspeed::comm::CommunicatorPtr comm,
                                              nlohmann::json cfg,
                                              bool only_first_reads_marker = false) {
  dp::PipelineInitializeArgs args;
  args.model = model(only_first_reads_marker);
  args.config_json = std::move(cfg);
  args.comm = comm;
  args.device = "cpu";
  return dp::initialize_pipeline(args);
}

// Every rank's parameters (by name) after kSteps batches at `zero_stage`.
std::vector<std::map<std::string, at::Tensor>> trained(int zero_stage,
                                                       bool ignore_unused_parameters = true) {
  std::vector<std::map<std::string, at::Tensor>> params(kWorld);
  run_ranks(kWorld, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto engine = engine_of(comm, config(zero_stage, ignore_unused_parameters));
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

// The check sees the earlier micro-batches' backward passes too (they accumulate outside the
// ZeRO stage): `sometimes` is used by all but the last, so the run passes, as with the default.
TEST(PipelineUnusedInLastMicroBatch, IgnoreUnusedParametersFalsePassesIt) {
  const auto ref = trained(1);
  for (int stage : {1, 2}) {
    const auto run = trained(stage, /*ignore_unused_parameters=*/false);
    for (int rank = 0; rank < kWorld; ++rank)
      for (const auto& [name, value] : ref[rank])
        EXPECT_LT((run[rank].at(name) - value).abs().max().item<double>(), 1e-5)
            << "ZeRO stage " << stage << ", rank " << rank << ", parameter " << name;
  }
}

// No micro-batch marked, and only the first layer reads the marker: only stage 0 has an unused
// parameter. Its data ranks fail the batch's step naming it; stage 1's fail with them, saying
// another stage's parameters did (without the job-wide count they went on into the step's
// collectives and failed there with "rank 0 ... left the group").
TEST(PipelineUnusedInLastMicroBatch, IgnoreUnusedParametersFalseFailsEveryStageTogether) {
  for (int stage : {1, 2}) {
    std::vector<std::string> messages(kWorld);
    run_ranks(kWorld, [&](deepspeed::comm::CommunicatorPtr comm) {
      auto engine = engine_of(comm, config(stage, /*ignore_unused_parameters=*/false),
                              /*only_first_reads_marker=*/true);
      const int d = comm->rank() % kDataRanks;
      int m = 0;
      messages[comm->rank()] = dstest::message_of<deepspeed::ConfigError>(
          [&] { engine->train_batch([&] { return micro_batch(0, m++, d, true); }); });
    });
    for (int rank = 0; rank < kWorld; ++rank) {
      EXPECT_CONTAINS(messages[rank], "ignore_unused_parameters is false");
      if (rank < kDataRanks) {
        EXPECT_CONTAINS(messages[rank], ": layer_00.sometimes.");
      } else {
        EXPECT_CONTAINS(messages[rank], "another pipeline stage");
      }
    }
  }
}

}  // namespace pipeline_unused_test
