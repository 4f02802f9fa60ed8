// The 1-bit optimizers on a GPU (label gpu): the compressed all-reduce's tensor operations on CUDA
// tensors against its host loops, and OneBitAdam, ZeroOneAdam and OneBitLamb training the example
// GPT on two ranks sharing the GPU over Gloo as they do on the CPU. Each test skips, saying why,
// without a GPU (and fails there under DS_EXPECT_GPU=1, bench/gpu/run.sh).
#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "comm/nccl_communicator.h"
#include "optim/compressed_allreduce.h"
#include "support/compressor_compare.h"
#include "support/deterministic.h"
#include "support/gpu_skip.h"
#include "support/ranks.h"
#include "support/training_run.h"

namespace {

using deepspeed::optim::CompressedAllReduce;
using dstest::compare_compressor_paths;

// The inputs of one call on `rank`, seeded by `seed`.
std::vector<torch::Tensor> inputs(const std::vector<int64_t>& sizes, uint64_t seed, int rank,
                                  bool plus_minus_one) {
  return dstest::compressor_inputs(sizes, seed + 10 * rank, plus_minus_one);
}

// CUDA tensors through Gloo (two ranks as threads sharing the GPU: the all-to-all and all-gather
// of packed signs on the device) against the host loops, as the CPU's
// CompressedAllReduce.TensorOperationsEqualTheHostLoops: ±1 inputs without padding bit for bit
// (every sum of squares is exact whatever its order), then a second call, and sizes that need
// padding (a chunk longer than the loops' 4096-element blocks too), to rounding.
TEST(OneBitGpu, CompressedAllReduceOnTheGpuMatchesTheHostLoops) {
  SKIP_WITHOUT_GPU();
  const std::vector<int64_t> exact_sizes = {16, 48, 1008, 20000};  // multiples of 8·W
  const std::vector<int64_t> padded_sizes = {5, 37, 1000, 20001};
  const c10::Device cuda(c10::kCUDA, 0);
  std::mutex mu;
  std::vector<std::string> failures;
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    std::vector<std::string> mine;
    CompressedAllReduce host(comm, exact_sizes), gpu(comm, exact_sizes, cuda);
    const int rank = comm->rank();
    const std::string who = "rank " + std::to_string(rank) + ", ";
    compare_compressor_paths(host, gpu, inputs(exact_sizes, 0, rank, true), true,
                             who + "call 1 (±1)", mine);
    compare_compressor_paths(host, gpu, inputs(exact_sizes, 100, rank, false), false,
                             who + "call 2", mine);
    // A device without its index ("cuda") means the current one, as torch::Device does.
    CompressedAllReduce host_padded(comm, padded_sizes),
        gpu_padded(comm, padded_sizes, c10::Device(c10::kCUDA));
    compare_compressor_paths(host_padded, gpu_padded, inputs(padded_sizes, 200, rank, false),
                             false, who + "padded sizes", mine);
    std::lock_guard<std::mutex> lock(mu);
    failures.insert(failures.end(), mine.begin(), mine.end());
  });
  for (const auto& f : failures) ADD_FAILURE() << f;
}

// The same over NCCL (a group of one: its all-to-all and all-gather of uint8 messages on the GPU,
// which the optimizers skip at one rank), against the host loops of a single-process group.
TEST(OneBitGpu, CompressedAllReduceRunsOnNccl) {
  SKIP_WITHOUT_GPU();
  const std::vector<int64_t> sizes = {8, 40, 1000};
  auto nccl = deepspeed::comm::make_nccl_communicator_on(c10::make_intrusive<c10d::HashStore>(), 0,
                                                         1, 0, 0, std::chrono::seconds(60));
  auto single = deepspeed::comm::make_single_process_communicator();
  std::vector<std::string> failures;
  CompressedAllReduce host(single, sizes), gpu(nccl, sizes, c10::Device(c10::kCUDA, 0));
  compare_compressor_paths(host, gpu, inputs(sizes, 300, 0, false), false, "NCCL call 1", failures);
  compare_compressor_paths(host, gpu, inputs(sizes, 400, 0, false), false, "NCCL call 2", failures);
  for (const auto& f : failures) ADD_FAILURE() << f;
  const auto stats = nccl->stats();  // by value: a reference into the temporary would dangle
  ASSERT_EQ(stats.count("all_to_all"), 1u) << "the exchange did not run on NCCL";
  EXPECT_EQ(stats.at("all_to_all").calls, 2);
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
