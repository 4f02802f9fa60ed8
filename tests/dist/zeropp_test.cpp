// ZeRO++ at stage 3 (zero/stage3/zeropp_options.h), ranks as threads:
// - the quantized collectives stay within the quantization bound of their exact counterparts;
// - training the test GPT with each of qwZ, hpZ, qgZ alone (and all three; and in bf16) ends
//   within 2% of the unquantized stage-3 loss; hpZ alone moves the same values, so it is
//   bit-identical (with gradient accumulation too);
// - hpZ's backward gathers run on the group communicator (2 of 4 ranks), off the world;
// - a bad zero_hpz_partition_size is refused naming the key;
// - a checkpoint of a qwZ + hpZ run saves and resumes bit-exact (the masters are unchanged).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <mutex>

#include "comm/op_observer.h"
#include "comm/quantize.h"
#include "deepspeed/errors.h"
#include "support/checkpoint_run.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/ranks.h"
#include "support/training_run.h"
#include "zero/stage3/quantized_gather.h"
#include "zero/stage3/quantized_reduce.h"

namespace {
namespace comm = deepspeed::comm;

// Block of the test GPT (n_embd 32): 12,704 elements, padded to at most 12,736. One block
// gathered at a time and released after its forward, so the backward gathers again (where hpZ
// acts).
constexpr int64_t kBlock = 12736;
nlohmann::json stage3_config(nlohmann::json zeropp = nlohmann::json::object(),
                             int accumulation = 1, bool bf16 = false) {
  auto config = dstest::base_config(2, accumulation, 3);
  if (bf16) config["bf16"] = {{"enabled", true}};
  auto& z = config["zero_optimization"];
  z["stage3_param_persistence_threshold"] = 0;
  z["stage3_max_live_parameters"] = kBlock;
  z["stage3_max_reuse_distance"] = 0;
  z["stage3_prefetch_bucket_size"] = kBlock;
  z["reduce_bucket_size"] = 100000;  // a bucket per unit: qgZ's chunks split evenly
  if (zeropp.is_object()) z.merge_patch(zeropp);  // (a null patch would replace the block)
  return config;
}

dstest::RunResult train(int world, const nlohmann::json& zeropp, int steps, int accumulation = 1,
                        bool bf16 = false) {
  dstest::RunSpec s;
  s.world_size = world;
  s.steps = steps;
  s.config = stage3_config(zeropp, accumulation, bf16);
  return dstest::train_gpt(s);
}

double mean_of_last(const std::vector<double>& v, size_t n) {
  double sum = 0;
  for (size_t i = v.size() - n; i < v.size(); ++i) sum += v[i];
  return sum / n;
}
}  // namespace

TEST(ZeroPPCollectives, QuantizedAllGatherWithinTheBound) {
  run_ranks(3, [](comm::CommunicatorPtr c) {
    at::set_num_threads(1);
    torch::manual_seed(10 + c->rank());
    for (int64_t n : {1, 999, 8000, 8003}) {
      at::Tensor slice = torch::randn({n}) * (c->rank() + 1);
      at::Tensor exact = torch::empty({3 * n});
      c->all_gather(exact, slice)->wait();
      at::Tensor full = torch::empty({3 * n});
      c->reset_stats();
      deepspeed::zero::quantized_all_gather(*c, full, slice)->wait();
      // On the wire: one byte per element (padded to 4) and a float per block.
      EXPECT_EQ(c->stats()["all_gather"].bytes, comm::quantized_bytes(n, 8));
      for (int r = 0; r < 3; ++r)
        for (int64_t b = 0; b < n; b += comm::kQuantBlock) {
          const int64_t len = std::min(comm::kQuantBlock, n - b);
          at::Tensor e = exact.narrow(0, r * n + b, len), q = full.narrow(0, r * n + b, len);
          const double half_step = e.abs().max().item<double>() / 127 / 2;
          EXPECT_LE((e - q).abs().max().item<double>(), half_step * (1 + 1e-5)) << n << " " << r;
        }
    }
  });
}

TEST(ZeroPPCollectives, QuantizedReduceScatterWithinTheBound) {
  run_ranks(3, [](comm::CommunicatorPtr c) {
    at::set_num_threads(1);
    torch::manual_seed(20 + c->rank());
    for (std::vector<int64_t> splits : std::vector<std::vector<int64_t>>{
             {4000, 4000, 4000}, {5, 0, 9001}, {0, 0, 0}, {1, 17000, 3}}) {
      int64_t total = 0;
      for (auto s : splits) total += s;
      at::Tensor input = torch::randn({total});
      at::Tensor exact = torch::empty({splits[c->rank()]});
      c->reduce_scatter_v(exact, input, splits)->wait();
      at::Tensor out = torch::empty({splits[c->rank()]});
      c->reset_stats();
      deepspeed::zero::quantized_reduce_scatter_v(*c, out, input, splits)->wait();
      const int64_t chunk = *std::max_element(splits.begin(), splits.end());
      if (chunk > 0)  // every peer gets an int8 chunk of the largest split
        EXPECT_EQ(c->stats()["all_to_all"].bytes, 3 * comm::quantized_bytes(chunk, 8));
      // Each other rank's segment is off by at most half its step (max|segment| / 127 / 2);
      // the own one is exact. peaks[d]: summed over senders, max|segment sent to d|.
      at::Tensor peaks = torch::zeros({3});
      int64_t offset = 0;
      for (int d = 0; d < 3; ++d) {
        if (splits[d] > 0) peaks[d] = input.narrow(0, offset, splits[d]).abs().max();
        offset += splits[d];
      }
      c->all_reduce(peaks)->wait();  // every rank, even one receiving nothing
      if (out.numel() == 0) continue;
      const double bound = peaks[c->rank()].item<double>() / 127 / 2 * (1 + 1e-5);
      EXPECT_LE((exact - out).abs().max().item<double>(), bound) << splits[0] << "," << splits[1];
    }
  });
}

// kSteps optimizer steps at world 4 (2 micro-batches of 16 tokens per rank and step). Each flag
// alone must end within 2% of the unquantized loss (mean of the last 10 steps and the last step).
constexpr int kSteps = 200;

TEST(ZeroPPTraining, EachFlagAloneEndsWithin2PercentOfStage3) {
  auto reference = train(4, {}, kSteps);
  ASSERT_EQ(reference.losses.size(), static_cast<size_t>(kSteps));
  const double ref_mean = mean_of_last(reference.losses, 10);
  const std::vector<std::pair<std::string, nlohmann::json>> cases = {
      {"qwZ", {{"zero_quantized_weights", true}}},
      {"qgZ", {{"zero_quantized_gradients", true}}},
      {"qwZ+hpZ+qgZ",
       {{"zero_quantized_weights", true}, {"zero_hpz_partition_size", 2},
        {"zero_quantized_gradients", true}}}};
  for (const auto& [name, flags] : cases) {
    auto run = train(4, flags, kSteps);
    ASSERT_EQ(run.losses.size(), static_cast<size_t>(kSteps)) << name;
    const double mean = mean_of_last(run.losses, 10);
    std::cout << name << ": first loss " << run.losses.front() << ", last " << run.losses.back()
              << " (stage 3: " << reference.losses.back() << "), mean of last 10 " << mean
              << " (stage 3: " << ref_mean << ")\n";
    EXPECT_LT(std::abs(mean - ref_mean) / ref_mean, 0.02) << name;
    EXPECT_LT(std::abs(run.losses.back() - reference.losses.back()) / reference.losses.back(), 0.02)
        << name;
    EXPECT_LT(run.losses.back(), 0.8 * run.losses.front()) << name;  // it does train
  }
  // hpZ alone moves the very values the world gather would: nothing changes.
  auto hpz = train(4, {{"zero_hpz_partition_size", 2}}, kSteps);
  EXPECT_EQ(hpz.losses, reference.losses);
  EXPECT_TRUE(dstest::bit_identical(hpz.weights, reference.weights));
}

TEST(ZeroPPTraining, Bf16AndGradientAccumulation) {
  // bf16 parameters (fp32 masters): the quantizers read and write bf16 buffers.
  const nlohmann::json all = {{"zero_quantized_weights", true}, {"zero_hpz_partition_size", 2},
                              {"zero_quantized_gradients", true}};
  auto reference = train(4, {}, 40, 1, /*bf16=*/true);
  auto run = train(4, all, 40, 1, /*bf16=*/true);
  ASSERT_EQ(run.losses.size(), 40u);
  std::cout << "bf16, 40 steps: qwZ+hpZ+qgZ " << run.losses.back() << ", stage 3 "
            << reference.losses.back() << "\n";
  EXPECT_LT(std::abs(run.losses.back() - reference.losses.back()) / reference.losses.back(), 0.02);
  // Accumulation (two forwards and backwards per step, secondaries dropped at each forward):
  // hpZ alone stays bit-identical.
  auto accumulated = train(4, {}, 10, 2);
  auto hpz = train(4, {{"zero_hpz_partition_size", 2}}, 10, 2);
  EXPECT_EQ(hpz.losses, accumulated.losses);
  EXPECT_TRUE(dstest::bit_identical(hpz.weights, accumulated.weights));
}

// Counts completed all_gathers by the size of the communicator they ran on (the op observer is
// process-wide: it sees every rank's thread).
class GatherCounter {
 public:
  GatherCounter()
      : observer_(std::make_shared<const comm::OpObserver>(
            [this](const std::string& op, int64_t bytes, double, int world) {
              if (op != "all_gather") return;
              std::lock_guard<std::mutex> lock(mu_);
              calls_[world]++;
              bytes_[world] += bytes;
            })) {
    comm::set_op_observer(observer_);
  }
  ~GatherCounter() { comm::clear_op_observer(observer_); }
  std::map<int, int64_t> calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }

 private:
  std::mutex mu_;
  std::map<int, int64_t> calls_, bytes_;
  std::shared_ptr<const comm::OpObserver> observer_;
};

TEST(ZeroPPHpz, BackwardGathersStayInsideTheGroup) {
  constexpr int kWorld = 4, kHpz = 2, kRunSteps = 6;
  // World all_gathers of rank 0 during training (after initialize: the group's split is done).
  auto world_gathers = [&](const nlohmann::json& zeropp, std::map<int, int64_t>* by_size) {
    dstest::RunSpec s;
    s.world_size = kWorld;
    s.steps = kRunSteps;
    s.config = stage3_config(zeropp);
    std::mutex mu;
    int64_t calls = 0;
    s.before_training = [](deepspeed::Engine& e) { e.communicator()->reset_stats(); };
    s.after_training = [&](deepspeed::Engine& e) {
      auto stats = e.communicator()->stats();
      std::lock_guard<std::mutex> lock(mu);
      if (e.communicator()->rank() == 0) calls = stats["all_gather"].calls;
    };
    GatherCounter counter;
    dstest::train_gpt(s);
    *by_size = counter.calls();
    return calls;
  };
  std::map<int, int64_t> off_sizes, on_sizes;
  const int64_t off = world_gathers({}, &off_sizes);
  const int64_t on = world_gathers({{"zero_hpz_partition_size", kHpz}}, &on_sizes);
  std::cout << "world all_gathers of rank 0 over " << kRunSteps << " steps: " << off
            << " without hpZ, " << on << " with hpZ 2; all_gathers of groups of 2 (all ranks): "
            << on_sizes[kHpz] << "\n";
  EXPECT_EQ(off_sizes.count(kHpz), 0u);
  // With hpZ the world sees the forward gathers of the 2 blocks and the root's regather after
  // each step, nothing else: no backward gather crosses the world.
  EXPECT_EQ(on, kRunSteps * 3);
  // Some backward gathers each step (the last block may stay gathered for its own backward).
  EXPECT_GE(on_sizes[kHpz], int64_t{kWorld} * kRunSteps);
  // Every gather that left the world went to a group of 2: per rank, the counts add up.
  EXPECT_EQ(off - on, on_sizes[kHpz] / kWorld);
  EXPECT_GT(off - on, 0);
}

TEST(ZeroPPHpz, SizeNotDividingTheWorldIsRefusedNamingTheKey) {
  const std::string msg = dstest::message_of<deepspeed::ConfigError>(
      [] { train(4, {{"zero_hpz_partition_size", 3}}, 1); });
  EXPECT_CONTAINS(msg, "zero_optimization.zero_hpz_partition_size' is 3");
  EXPECT_CONTAINS(msg, "world size 4");
}

TEST(ZeroPPCheckpoint, QwzHpzRunResumesBitExact) {
  dstest::TempDir dir;
  dstest::CheckpointJob full;
  full.world_size = 4;
  full.config = stage3_config({{"zero_quantized_weights", true}, {"zero_hpz_partition_size", 2}});
  full.steps = 12;
  full.save_dir = dir.path();
  full.save_at = {6};
  auto uninterrupted = dstest::run_checkpoint_job(full);
  ASSERT_EQ(uninterrupted.losses.size(), 12u);

  dstest::CheckpointJob resumed = full;
  resumed.save_at = {};
  resumed.load_dir = dir.path();
  resumed.model_seed = 4242;  // different initial weights: the checkpoint must replace them
  auto second = dstest::run_checkpoint_job(resumed);
  EXPECT_EQ(second.start_step, 6);
  ASSERT_EQ(second.losses.size(), 6u);
  for (size_t i = 0; i < 6; ++i)
    EXPECT_EQ(second.losses[i], uninterrupted.losses[6 + i]) << "step " << 7 + i;  // bit for bit
  EXPECT_TRUE(dstest::bit_identical(second.weights, uninterrupted.weights));
  // The normal layout: the same files an unquantized stage-3 run writes.
  EXPECT_TRUE(std::filesystem::exists(dir / "global_step6/mp_rank_00_model_states.safetensors"));
}
