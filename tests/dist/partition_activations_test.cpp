// activation_checkpointing.partition_activations: with a tensor-parallel group (initialize()'s
// topology) each rank keeps 1/N of a checkpointed block's input and the group all-gathers it before
// the recomputation. gpt::TPGPT at tensor 2 trains to the same losses and weights with and without
// partitioning (and without checkpointing), while the bytes of saved inputs halve; with
// cpu_checkpointing too; without a tensor group the checkpoints stay whole; in-place changes of a
// partitioned input are refused as for a whole one.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <string>

#include "deepspeed/checkpointing.h"
#include "deepspeed/deepspeed.h"
#include "deepspeed/errors.h"
#include "gpt/model.h"
#include "gpt/tp_model.h"
#include "support/ranks.h"
#include "support/training_run.h"

namespace partition_activations_test {

namespace {
namespace ckpt = deepspeed::checkpointing;

struct Result {
  std::vector<double> losses;
  std::vector<torch::Tensor> weights;  // rank 0's slices after the last step
  int64_t peak_saved_bytes = 0;        // over both ranks (the counters are per process)
};

std::mutex rng_mutex;

// tp 2 x dp 1 at world 2 (tensor = 2), or the plain GPT over `world` data-parallel ranks
// (tensor = 1), 4 steps of 4 samples.
Result train(int tensor, bool checkpointing, const nlohmann::json& block, int world = 2) {
  gpt::GPTConfig c{256, 16, 3, 4, 32};
  c.activation_checkpointing = checkpointing;
  auto config = dstest::base_config(4 / (world / tensor), 1, 1);
  config["gradient_clipping"] = 0.5;
  config["activation_checkpointing"] = block;
  auto data = dstest::test_text_dataset(16);
  Result out;
  std::mutex mu;
  ckpt::reset_stats();
  run_ranks(world, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto topology = std::make_shared<deepspeed::comm::Topology>(
        comm, deepspeed::comm::TopologySizes{1, tensor});
    std::shared_ptr<gpt::GPTImpl> full;
    {
      std::lock_guard<std::mutex> lock(rng_mutex);
      torch::manual_seed(7);
      full = std::make_shared<gpt::GPTImpl>(c);
    }
    std::vector<double> losses;
    auto loop = [&](auto model) {
      auto [engine, o, loader, s] = deepspeed::initialize<typename decltype(model)::element_type>(
          {.model = model, .config_json = config, .training_data = data, .topology = topology});
      while (engine->global_steps() < 4) {
        auto batch = loader->next();
        engine->backward(engine->forward(batch.data, batch.target));
        engine->step();
        losses.push_back(engine->last_loss());
      }
      std::lock_guard<std::mutex> lock(mu);
      if (comm->rank() == 0) {
        out.losses = losses;
        for (auto& p : model->parameters()) out.weights.push_back(p.detach().clone());
      }
    };
    if (tensor == 1) return loop(full);
    std::shared_ptr<gpt::TPGPTImpl> split;
    {
      std::lock_guard<std::mutex> lock(rng_mutex);
      split = std::make_shared<gpt::TPGPTImpl>(c, topology->tensor_parallel());
    }
    split->copy_from(*full);
    loop(split);
  });
  out.peak_saved_bytes = ckpt::stats().peak_saved_bytes;
  return out;
}

}  // namespace

TEST(PartitionActivations, TensorParallelGptSameResultsHalfTheSavedBytes) {
  const nlohmann::json whole = {{"partition_activations", false}};
  const nlohmann::json split = {{"partition_activations", true}};
  const Result plain = train(2, false, whole);
  const Result kept = train(2, true, whole);
  const Result parted = train(2, true, split);
  ASSERT_EQ(plain.losses.size(), 4u);
  // The recomputation runs the same operators on the same (gathered) values: bit-identical.
  EXPECT_EQ(kept.losses, plain.losses);
  EXPECT_EQ(parted.losses, kept.losses);
  EXPECT_EQ(dstest::max_abs_diff(parted.weights, kept.weights), 0.0);
  EXPECT_EQ(dstest::max_abs_diff(kept.weights, plain.weights), 0.0);
  // 3 blocks x [4, 16, 32] fp32 inputs held at the peak of each rank's forward: each rank keeps
  // half of each when partitioned (the counters add both ranks' bytes).
  EXPECT_GT(kept.peak_saved_bytes, 0);
  EXPECT_EQ(parted.peak_saved_bytes * 2, kept.peak_saved_bytes);
  std::printf("saved checkpoint inputs, both ranks: %lld bytes whole, %lld partitioned\n",
              static_cast<long long>(kept.peak_saved_bytes),
              static_cast<long long>(parted.peak_saved_bytes));

  // cpu_checkpointing composes (host copies of the partitions; on a CPU build the same tensors).
  const Result host =
      train(2, true, {{"partition_activations", true}, {"cpu_checkpointing", true}});
  EXPECT_EQ(host.losses, kept.losses);
  EXPECT_EQ(host.peak_saved_bytes, parted.peak_saved_bytes);
}

// Without a tensor-parallel group there is nothing to split over: configure() warns once and the
// checkpoints are kept whole (the same bytes as without the key).
// One rank: the process-wide peak is then this rank's alone (two free-running data-parallel
// threads make a summed peak depend on how their forwards overlap).
TEST(PartitionActivations, WithoutATensorGroupCheckpointsStayWhole) {
  const Result kept = train(1, true, {{"partition_activations", false}}, 1);
  const Result asked = train(1, true, {{"partition_activations", true}}, 1);
  EXPECT_EQ(asked.losses, kept.losses);
  EXPECT_EQ(asked.peak_saved_bytes, kept.peak_saved_bytes);
}

// The explicit group (DeepSpeed's configure(mpu_)) for a model outside initialize(): a
// checkpointed segment's input split and regathered by hand gives the unsplit gradient, and what
// each rank holds between forward and backward is its padded half: ceil(7 / 2) = 4 floats.
TEST(PartitionActivations, ExplicitGroupSplitsAnOddSizedInput) {
  ckpt::Options o;
  o.partition_activations = true;
  ckpt::configure(o);
  // The counters are per process (both rank threads add to them): compare against what an
  // earlier test may have left held.
  const int64_t before = ckpt::stats().saved_bytes;
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    ckpt::set_model_parallel_group(comm);
    auto x = torch::arange(7, torch::kFloat).requires_grad_(true);  // 7: padded to 8 to split
    auto y = ckpt::checkpoint([](const torch::Tensor& t) { return (t * t).sin(); }, x);
    comm->barrier();  // both ranks have saved; neither has released (backward is after the next)
    // 2 ranks x 4 floats x 4 B = 32 (kept whole: 2 x 7 x 4 = 56; unpadded floor: 2 x 3 x 4 = 24).
    EXPECT_EQ(ckpt::stats().saved_bytes - before, 2 * 4 * 4) << "rank " << comm->rank();
    comm->barrier();
    y.sum().backward();
    auto want = (2 * torch::arange(7, torch::kFloat) *
                 (torch::arange(7, torch::kFloat) * torch::arange(7, torch::kFloat)).cos());
    EXPECT_LT((x.grad() - want).abs().max().item<double>(), 1e-6);
    ckpt::set_model_parallel_group(nullptr);
  });
  EXPECT_EQ(ckpt::stats().saved_bytes, before);  // both partitions released after backward
  ckpt::configure(ckpt::Options{});
}

// A partitioned input is saved as a copy (this rank's slice), so a change in place no longer
// reaches what the recomputation reads; it is refused all the same, as for a checkpoint kept
// whole (one behaviour whatever the config): after the checkpoint at backward, on every rank and
// before the all-gather (no rank left waiting in it); by the segment itself at forward.
TEST(PartitionActivations, InPlaceChangesOfAPartitionedInputAreRefusedOnEveryRank) {
  ckpt::Options o;
  o.partition_activations = true;
  ckpt::configure(o);
  std::atomic<int> after{0}, inside{0};
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    ckpt::set_model_parallel_group(comm);
    auto x = torch::arange(8, torch::kFloat).requires_grad_(true);
    auto h = x * 2;
    auto y = ckpt::checkpoint([](const torch::Tensor& t) { return t.sin(); }, h);
    h.add_(1);
    try {
      y.sum().backward();
    } catch (const deepspeed::Error& e) {
      if (std::string(e.what()).find("modified by an inplace operation") != std::string::npos)
        ++after;
    }
    auto w = torch::ones({8}, torch::requires_grad());
    auto z = torch::ones({8});
    try {
      ckpt::checkpoint([w](const torch::Tensor& t) { return t.mul_(3) * w; }, z);
    } catch (const deepspeed::Error& e) {
      if (std::string(e.what()).find("must not modify its inputs") != std::string::npos) ++inside;
    }
    ckpt::set_model_parallel_group(nullptr);
  });
  ckpt::configure(ckpt::Options{});
  EXPECT_EQ(after.load(), 2);
  EXPECT_EQ(inside.load(), 2);
}

}  // namespace partition_activations_test
