// ZeRO++ at stage 3 (zero/stage3/zeropp_options.h), ranks as threads:
// - the quantized collectives stay within the quantization bound of their exact counterparts;
// - qgZ's two hops (int4 inside a node, int8 across) stay within their bound, with int4 bytes
//   on the node's group;
// - training the test GPT with each of qwZ, hpZ, qgZ alone (qgZ in one hop and in two, 2
//   "nodes" of 2 ranks; all three; and in bf16) ends
//   within 2% of the unquantized stage-3 loss; hpZ alone moves the same values, so it is
//   bit-identical (with gradient accumulation too);
// - hpZ's backward gathers run on the group communicator (2 of 4 ranks), off the world;
// - a bad zero_hpz_partition_size is refused naming the key;
// - a checkpoint of a qwZ + hpZ run saves and resumes bit-exact (the masters are unchanged).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
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

namespace zeropp_test {

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

// qgZ's two hops on 4 ranks as 2 nodes of 2: the sum is within the int4-then-int8 bound of the
// exact one, the node's hop moves int4 (half a byte a value) and the cross-node hop int8, and
// the cross-node hop carries 2 chunks where the single hop moves 4.
TEST(ZeroPPCollectives, TwoHopQuantizedReduceScatterWithinTheBound) {
  run_ranks(4, [](comm::CommunicatorPtr c) {
    at::set_num_threads(1);
    auto hops = deepspeed::zero::make_qgz_hops(*c, 2);
    ASSERT_TRUE(hops.two_hops());
    EXPECT_EQ(hops.intra->rank(), c->rank() % 2);  // node = consecutive ranks
    EXPECT_EQ(hops.inter->rank(), c->rank() / 2);
    EXPECT_FALSE(deepspeed::zero::make_qgz_hops(*c, 4).two_hops());  // one node: one hop
    torch::manual_seed(40 + c->rank());
    for (std::vector<int64_t> splits : std::vector<std::vector<int64_t>>{
             {4000, 4000, 4000, 4000}, {5, 0, 9001, 7}, {0, 0, 0, 0}, {1, 17000, 3, 0}}) {
      int64_t total = 0;
      for (auto s : splits) total += s;
      at::Tensor input = torch::randn({total});
      at::Tensor exact = torch::empty({splits[c->rank()]});
      c->reduce_scatter_v(exact, input, splits)->wait();
      at::Tensor out = torch::empty({splits[c->rank()]});
      hops.intra->reset_stats();
      hops.inter->reset_stats();
      deepspeed::zero::quantized_reduce_scatter_v(*c, hops, out, input, splits)->wait();
      const int64_t chunk = *std::max_element(splits.begin(), splits.end());
      if (chunk > 0) {
        // Hop 1: to each of the 2 node ranks, 2 segments (one per node) at 4 bits.
        EXPECT_EQ(hops.intra->stats()["all_to_all"].bytes, 2 * comm::quantized_bytes(2 * chunk, 4));
        // (half a byte a value: chunk bytes for 2·chunk values, + the block scales and at most 3
        // bytes of alignment)
        EXPECT_LE(comm::quantized_bytes(2 * chunk, 4), chunk + 4 * ((2 * chunk + 7999) / 8000) + 3);
        // Hop 2: to each of the 2 nodes, one chunk at 8 bits.
        EXPECT_EQ(hops.inter->stats()["all_to_all"].bytes, 2 * comm::quantized_bytes(chunk, 8));
      }
      // Bound, with M = max |input| over ranks: each node's partial carries its one peer's int4
      // error (<= M / 7 / 2), so the sum carries two; hop 2 adds the other node's int8 error on
      // a partial of at most 2M (1 + 1/7): 2M·(8/7) / 127 / 2. (Measured: ~0.12 M.)
      at::Tensor peak = input.numel() ? input.abs().max().reshape({1}) : torch::zeros({1});
      c->all_reduce(peak, comm::ReduceOp::Max)->wait();
      if (out.numel() == 0) continue;
      const double m = peak.item<double>();
      const double bound = (2 * m / 7 / 2 + 2 * m * 8 / 7 / 127 / 2) * (1 + 1e-5);
      EXPECT_LE((exact - out).abs().max().item<double>(), bound) << splits[0] << "," << splits[1];
    }
  });
}

// qwZ's int8 wire forms (this rank's slice and every rank's) are memory too: while a gather is in
// flight they count with the gathered units, so the peak is above the same schedule's exact
// gathers by about one block's wires (blocks differ a little in padding), and none are left once
// the gathers are done.
TEST(ZeroPPMemory, QuantizedGathersCountTheirWireForms) {
  auto plain = train(2, {}, 2);
  auto qwz = train(2, {{"zero_quantized_weights", true}}, 2);
  const int64_t wires = deepspeed::zero::quantized_gather_wire_bytes(kBlock / 2, 2);
  for (int r = 0; r < 2; ++r) {
    const auto &p = plain.memory.at(r), &q = qwz.memory.at(r);
    std::cout << "rank " << r << ": peak gathered bytes " << p.peak_gathered_bytes << " exact, "
              << q.peak_gathered_bytes << " qwZ (one block's wires: " << wires << ")\n";
    EXPECT_GE(q.peak_gathered_bytes, p.peak_gathered_bytes + wires * 9 / 10);
    EXPECT_LE(q.peak_gathered_bytes, p.peak_gathered_bytes + 2 * wires);
    EXPECT_EQ(q.gathered_bytes, p.gathered_bytes) << "wire bytes left after their gathers";
  }
}

// kSteps optimizer steps at world 4 (2 micro-batches of 16 tokens per rank and step). Each flag
// alone must end within 2% of the unquantized loss (mean of the last 10 steps and the last step).
constexpr int kSteps = 200;

TEST(ZeroPPTraining, EachFlagAloneEndsWithin2PercentOfStage3) {
  auto reference = train(4, {}, kSteps);
  ASSERT_EQ(reference.losses.size(), static_cast<size_t>(kSteps));
  const double ref_mean = mean_of_last(reference.losses, 10);
  std::vector<std::pair<std::string, nlohmann::json>> cases = {
      {"qwZ", {{"zero_quantized_weights", true}}},
      {"qgZ", {{"zero_quantized_gradients", true}}},
      {"qwZ+hpZ+qgZ",
       {{"zero_quantized_weights", true}, {"zero_hpz_partition_size", 2},
        {"zero_quantized_gradients", true}}}};
  // qgZ in two hops: the ranks as 2 nodes of 2 (what dsrun's LOCAL_WORLD_SIZE says on 2 hosts).
  cases.push_back({"qgZ two hops", {{"zero_quantized_gradients", true}}});
  for (const auto& [name, flags] : cases) {
    const bool two_hops = name == "qgZ two hops";
    // all_to_alls by the size of their communicator (the observer is process-wide).
    std::mutex mu;
    std::map<int, int64_t> all_to_alls;
    auto observer = std::make_shared<const comm::OpObserver>(
        [&](const std::string& op, int64_t, double, int world) {
          if (op != "all_to_all") return;
          std::lock_guard<std::mutex> lock(mu);
          all_to_alls[world]++;
        });
    comm::set_op_observer(observer);
    if (two_hops) setenv("LOCAL_WORLD_SIZE", "2", 1);
    auto run = train(4, flags, kSteps);
    unsetenv("LOCAL_WORLD_SIZE");
    comm::clear_op_observer(observer);
    if (name == "qgZ") EXPECT_GT(all_to_alls[4], 0) << name;  // one hop over the world
    if (two_hops) {  // both hops on the groups of 2, none over the world
      EXPECT_GT(all_to_alls[2], 0) << name;
      EXPECT_EQ(all_to_alls[4], 0) << name;
    }
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

}  // namespace zeropp_test
