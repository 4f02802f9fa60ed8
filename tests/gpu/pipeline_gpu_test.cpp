// Pipeline parallelism on a GPU (label gpu): the example GPT cut into two stages, one per rank,
// both ranks sharing the one GPU over Gloo (NCCL refuses two ranks on one GPU; the activations and
// their gradients go through host memory there), trains with the per-step losses of the same
// layers as one module at ZeRO stage 0 over the same two ranks and the same global batch, as
// tests/dist/pipeline_test.cpp checks on the CPU. Skips, saying why, without a GPU (and fails
// there under DS_EXPECT_GPU=1, bench/gpu/run.sh).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <iostream>
#include <mutex>
#include <vector>

#include "deepspeed/engine.h"
#include "deepspeed/pipe.h"
#include "gpt/pipeline_model.h"
#include "support/deterministic.h"
#include "support/expect.h"
#include "support/gpu_skip.h"
#include "support/pipeline_gpt.h"
#include "support/ranks.h"
#include "support/training_run.h"

namespace {

namespace dp = deepspeed::pipe;

constexpr int kWorld = 2;
constexpr int kSteps = 3;

// Pipe 2 x data 1 on the GPU, ZeRO stage `zero_stage` inside each stage; every rank's losses.
std::vector<std::vector<double>> pipeline_losses(int zero_stage) {
  std::vector<std::vector<double>> losses(kWorld);
  run_ranks(kWorld, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto args = dstest::pipeline_args(comm, /*stages=*/kWorld, zero_stage,
                                      dstest::tiny_pipeline_gpt(false));
    args.device = "cuda";
    auto engine = dp::initialize_pipeline(args);
    losses[comm->rank()] = dstest::train_pipeline_steps(*engine, comm, 0, kSteps);
  });
  return losses;
}

TEST(PipelineGpu, TwoStagesTrainAsOneModule) {
  SKIP_WITHOUT_GPU();
  const dstest::Deterministic deterministic;
  // The same layers as one module, ZeRO stage 0, data parallel over both ranks, on the GPU.
  const auto reference = dstest::one_module_losses(
      kWorld, dstest::tiny_pipeline_gpt(false), dstest::pipeline_config(kWorld, 0), "cuda", kSteps);
  ASSERT_EQ(reference.size(), static_cast<size_t>(kSteps));
  for (int zero_stage : {0, 1}) {
    const auto runs = pipeline_losses(zero_stage);
    for (int rank = 0; rank < kWorld; ++rank) {
      const double diff = dstest::max_rel_diff(runs[rank], reference);
      std::cout << "pipe 2 x data 1 on the GPU, ZeRO " << zero_stage << ", rank " << rank
                << ": losses within " << diff << " relative of one module's\n";
      // fp32, deterministic kernels: only summation orders differ (the accumulation over 4 or 8
      // micro-batches, the data-parallel mean), as on the CPU.
      EXPECT_LT(diff, 1e-5) << "ZeRO " << zero_stage << ", rank " << rank;
    }
  }
}

}  // namespace
