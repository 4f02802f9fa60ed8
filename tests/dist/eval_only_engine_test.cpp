// An engine without an optimizer on several ranks (DeepSpeed-Chat's ZeRO-3 reference model):
// stage 3 partitions the weights and gathers each unit for forward, and every rank evaluates
// what the whole, unpartitioned model does.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mutex>

#include "deepspeed/deepspeed.h"
#include "deepspeed/pipe.h"
#include "gpt/model.h"
#include "gpt/pipeline_model.h"
#include "support/expect.h"
#include "support/pipeline_gpt.h"
#include "support/ranks.h"
#include "support/training_run.h"

namespace eval_only_engine_test {

TEST(EvalOnlyEngine, StageThreeForwardEqualsTheUnpartitionedModel) {
  const int world = 2;
  const gpt::GPTConfig shape{256, 16, 2, 2, 32};
  nlohmann::json config = dstest::base_config(2, 1, 3);
  config.erase("optimizer");
  const auto x = torch::randint(0, 256, {2, 16}, torch::kLong);
  const auto y = torch::randint(0, 256, {2, 16}, torch::kLong);
  // Built on this thread: the global RNG is not per-thread.
  torch::manual_seed(11);
  auto reference = std::make_shared<gpt::GPTImpl>(shape);
  int64_t whole_bytes = 0;
  for (auto& p : reference->parameters()) whole_bytes += p.numel() * p.element_size();
  std::vector<std::shared_ptr<gpt::GPTImpl>> models;
  for (int r = 0; r < world; ++r) {
    torch::manual_seed(11);
    models.push_back(std::make_shared<gpt::GPTImpl>(shape));
  }
  double want = 0.0;
  {
    torch::NoGradGuard no_grad;
    want = reference->forward(x, y).item<double>();
  }
  std::mutex mu;
  std::vector<double> got(world, 0.0);
  std::vector<deepspeed::MemoryReport> memory(world);
  run_ranks(world, [&](deepspeed::comm::CommunicatorPtr comm) {
    const int rank = comm->rank();
    auto r = deepspeed::initialize<gpt::GPTImpl>(
        {.model = models[rank], .config_json = config, .comm = comm});
    EXPECT_EQ(r.optimizer, nullptr);
    torch::NoGradGuard no_grad;
    const double loss = r.engine->forward(x, y).item<double>();
    std::lock_guard<std::mutex> lock(mu);
    got[rank] = loss;
    memory[rank] = r.engine->memory_report();
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_NEAR(got[r], want, 1e-6 * std::abs(want)) << "rank " << r;
    EXPECT_EQ(memory[r].optimizer_states, 0) << "rank " << r;
    EXPECT_EQ(memory[r].gradients, 0) << "rank " << r;
    // Partitioned: each rank holds about half the weights (the root unit's are whole).
    EXPECT_LT(memory[r].parameters, whole_bytes * 3 / 4) << "rank " << r;
  }
}

// A pipeline engine without an optimizer (2 stages x 2 data ranks, ZeRO 0 and 1): eval_batch
// gives every rank the loss the whole model gives, averaged over the data ranks' micro-batches
// (DeepSpeed's eval_batch reduces over the data-parallel group), and
// train_batch is refused on every rank by name before any transfer (no rank waits on another).
TEST(EvalOnlyPipeline, EvaluatesOnEveryStageAndRefusesTraining) {
  namespace dp = deepspeed::pipe;
  constexpr int kStages = 2;
  constexpr int kData = dstest::kPipeWorld / kStages;
  constexpr int kMicroPerRank = dstest::kPipeGlobalMicro / kData;
  // The same layers as one module, seeded as the pipeline seeds them (config "seed": 5).
  double want = 0.0;
  {
    torch::NoGradGuard no_grad;
    dp::PipelineSequentialImpl reference(gpt::gpt_pipeline(dstest::tiny_pipeline_gpt(false)), 5);
    for (int d = 0; d < kData; ++d)
      for (int m = 0; m < kMicroPerRank; ++m) {
        auto [x, y] = dstest::pipeline_micro_batch(0, m * kData + d);
        want += reference.forward(x, y).item<double>() / dstest::kPipeGlobalMicro;
      }
  }
  for (int zero_stage : {0, 1}) {
    std::mutex mu;
    std::vector<double> losses(dstest::kPipeWorld, 0.0);
    std::vector<std::string> refusals(dstest::kPipeWorld);
    run_ranks(dstest::kPipeWorld, [&](deepspeed::comm::CommunicatorPtr comm) {
      auto args = dstest::pipeline_args(comm, kStages, zero_stage,
                                        dstest::tiny_pipeline_gpt(false));
      args.config_json.erase("optimizer");
      auto engine = dp::initialize_pipeline(args);
      EXPECT_EQ(engine->optimizer(), nullptr);
      const int d = comm->rank() % kData;
      int m = 0;
      const double loss =
          engine->eval_batch([&] { return dstest::pipeline_micro_batch(0, m++ * kData + d); });
      std::string refusal;
      try {
        engine->train_batch([&] { return dstest::pipeline_micro_batch(1, 0); });
      } catch (const std::exception& e) {
        refusal = e.what();
      }
      std::lock_guard<std::mutex> lock(mu);
      losses[comm->rank()] = loss;
      refusals[comm->rank()] = refusal;
    }, std::chrono::seconds(60));
    for (int r = 0; r < dstest::kPipeWorld; ++r) {
      EXPECT_NEAR(losses[r], want, 1e-5 * want) << "ZeRO-" << zero_stage << " rank " << r;
      EXPECT_CONTAINS(refusals[r], "must provide optimizer") << "ZeRO-" << zero_stage << " rank " << r;
    }
  }
}

}  // namespace eval_only_engine_test
