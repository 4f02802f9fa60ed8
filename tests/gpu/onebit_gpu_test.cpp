// The 1-bit optimizers on a GPU (label gpu): the compressed all-reduce's tensor operations on CUDA
// tensors against its host loops, and OneBitAdam, ZeroOneAdam and OneBitLamb training the example
// GPT on two ranks sharing the GPU over Gloo as they do on the CPU. Each test skips, saying why,
// without a GPU (and fails there under DS_EXPECT_GPU=1, bench/gpu/run.sh).
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "optim/compressed_allreduce.h"
#include "support/deterministic.h"
#include "support/gpu_skip.h"
#include "support/ranks.h"
#include "support/training_run.h"

namespace {

using deepspeed::optim::CompressedAllReduce;

// Elements of `got` farther than 1e-5 of the largest |want| from `want`.
int64_t elements_off(const torch::Tensor& got, const torch::Tensor& want) {
  const double largest = std::max(want.abs().max().item<double>(), 1e-30);
  return (got.cpu() - want).abs().gt(1e-5 * largest).sum().item<int64_t>();
}

// CUDA tensors through Gloo (two ranks as threads sharing the GPU: the all-to-all and the
// all-gather of packed signs on the device), against the host loops on copies of the same inputs
// over four calls, error feedback included. Sizes that need padding, and a chunk longer than one
// of the loops' 4096-element blocks. The scales are summed in another order, so an element so
// near zero that a scale's last bit flips its sign may differ: at most 2 per tensor.
TEST(OneBitGpu, CompressedAllReduceOnTheGpuMatchesTheHostLoops) {
  SKIP_WITHOUT_GPU();
  const std::vector<int64_t> sizes = {5, 37, 1000, 20000};
  std::mutex mu;
  std::vector<std::string> failures;
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    CompressedAllReduce host(comm, sizes);
    CompressedAllReduce gpu(comm, sizes, c10::Device(c10::kCUDA, 0));
    std::vector<std::string> mine;
    auto check = [&](int round, const std::string& what, const torch::Tensor& got,
                     const torch::Tensor& want) {
      const int64_t off = elements_off(got, want);
      if (off > 2)
        mine.push_back("call " + std::to_string(round) + ", rank " + std::to_string(comm->rank()) +
                       ": " + what + " differs in " + std::to_string(off) + " elements");
    };
    for (int round = 0; round < 4; ++round) {
      std::vector<torch::Tensor> on_host, on_gpu;
      for (size_t i = 0; i < sizes.size(); ++i) {
        auto gen = at::detail::createCPUGenerator(1000 * round + 10 * comm->rank() + i);
        torch::Tensor x = torch::randn({sizes[i]}, gen);
        on_host.push_back(x.clone());
        on_gpu.push_back(x.to(torch::kCUDA));
      }
      host.run(on_host);
      gpu.run(on_gpu);  // on the device: the tensor operations
      for (size_t i = 0; i < sizes.size(); ++i)
        check(round, "tensor " + std::to_string(i), on_gpu[i], on_host[i]);
      check(round, "worker error", gpu.worker_error(), host.worker_error());
      check(round, "server error", gpu.server_error(), host.server_error());
      if (!gpu.worker_error().is_cuda()) mine.push_back("the error feedback is not on the GPU");
    }
    std::lock_guard<std::mutex> lock(mu);
    failures.insert(failures.end(), mine.begin(), mine.end());
  });
  for (const auto& f : failures) ADD_FAILURE() << f;
}

struct OneBitCase {
  const char* name;
  nlohmann::json optimizer;
};

// Past each warm-up within the run's 12 steps: the compressed exchange runs from step 4 (0/1 Adam:
// its local steps and syncs from step 6).
const std::vector<OneBitCase>& cases() {
  static const std::vector<OneBitCase> all = {
      {"OneBitAdam",
       {{"type", "OneBitAdam"}, {"params", {{"lr", 3e-3}, {"eps", 1e-4}, {"freeze_step", 3}}}}},
      {"ZeroOneAdam",
       {{"type", "ZeroOneAdam"},
        {"params", {{"lr", 1e-3}, {"eps", 1e-4}, {"var_freeze_step", 4}, {"var_update_scaler", 2},
                    {"local_step_scaler", 2}, {"local_step_clipper", 4}}}}},
      {"OneBitLamb",
       {{"type", "OneBitLamb"},
        {"params", {{"lr", 0.03}, {"weight_decay", 0.01}, {"freeze_step", 3}}}}},
  };
  return all;
}

// Two ranks sharing the GPU over Gloo train as two ranks on the CPU: the same update and exchange
// (the GPU's in tensor operations), so the runs differ only by the GPU's arithmetic order (and the
// compressed signs that order flips, which the error feedback carries on). fp32, stage 0 (the
// 1-bit optimizers' stage), and bf16 for the two Adams.
TEST(OneBitGpu, OneBitFamilyTrainsOnTheGpuAsOnTheCpu) {
  SKIP_WITHOUT_GPU();
  const dstest::Deterministic deterministic;
  for (const auto& c : cases()) {
    for (bool bf16 : {false, true}) {
      if (bf16 && std::string(c.name) == "OneBitLamb") continue;  // fp32 and fp16 only
      dstest::RunSpec spec;
      spec.world_size = 2;
      spec.steps = 12;
      spec.config = dstest::base_config(2, 1, 0);
      spec.config["optimizer"] = c.optimizer;
      if (bf16) spec.config["bf16"] = {{"enabled", true}};
      spec.device = "cuda";
      auto on_gpu = dstest::train_gpt(spec);
      spec.device = "cpu";
      auto on_cpu = dstest::train_gpt(spec);
      const double diff = dstest::max_loss_rel_diff(on_gpu, on_cpu);
      std::cout << c.name << (bf16 ? " bf16" : " fp32") << ": GPU against CPU, losses within "
                << diff << " relative; last loss " << on_gpu.losses.back() << " (first "
                << on_gpu.losses.front() << ")\n";
      EXPECT_LE(diff, bf16 ? 2e-2 : 1e-3) << c.name << (bf16 ? " bf16" : " fp32");
      EXPECT_LT(on_gpu.losses.back(), on_gpu.losses.front()) << c.name;
    }
  }
}

}  // namespace
