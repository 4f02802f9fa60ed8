// Reduce-scatters and all-gathers within and then across hosts (gloo_hierarchy.h), on ranks as
// threads that count as on several hosts (run_ranks_on_hosts): the values of every collective that
// takes the path, for the host layouts it accepts (hosts in rank blocks, interleaved, 3 hosts),
// several in flight, the within-host phase in shared-memory pieces, a rank that leaves (the
// others' errors name their collective), and ZeRO-2/3 training against every rank to every rank.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "comm/gloo_communicator.h"
#include "deepspeed/errors.h"
#include "runtime/engine_state.h"
#include "support/comm_patterns.h"
#include "support/expect.h"
#include "support/ranks.h"
#include "support/scoped_env.h"
#include "support/training_run.h"

namespace gloo_hierarchy_test {

using deepspeed::comm::CommunicatorPtr;
using deepspeed::comm::ReduceOp;

using dstest::pattern;

// Small integers (comm_patterns.h): every partial sum is exact in bf16 too.
at::Tensor expected(int64_t n, int world, ReduceOp op) {
  return dstest::expected_reduce(n, world, at::kDouble, op);
}

void check_collectives(CommunicatorPtr c) {
  ASSERT_TRUE(deepspeed::comm::gloo_hierarchical(*c));
  const int r = c->rank(), w = c->world_size();
  for (at::ScalarType type : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(std::string("dtype ") + c10::toString(type));
    const int64_t n = 6;
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
      at::Tensor out = at::zeros({n}, type);
      c->reduce_scatter(out, pattern(n * w, r, type), op)->wait();
      EXPECT_TRUE(out.to(at::kDouble).allclose(expected(n * w, w, op).narrow(0, r * n, n), 1e-2))
          << "reduce_scatter, op " << static_cast<int>(op) << "\n" << out;
    }
    // Uneven, one rank with nothing.
    std::vector<int64_t> splits;
    for (int p = 0; p < w; ++p) splits.push_back(p == 1 ? 0 : p + 2);
    int64_t total = 0, offset = 0;
    for (int p = 0; p < w; ++p) {
      if (p < r) offset += splits[p];
      total += splits[p];
    }
    at::Tensor v_out = at::zeros({splits[r]}, type);
    c->reduce_scatter_v(v_out, pattern(total, r, type), splits, ReduceOp::Sum)->wait();
    EXPECT_TRUE(v_out.to(at::kDouble).equal(expected(total, w, ReduceOp::Sum)
                                                .narrow(0, offset, splits[r])))
        << "reduce_scatter_v";

    at::Tensor gathered = at::zeros({n * w}, type);
    c->all_gather(gathered, pattern(n, r, type))->wait();
    for (int p = 0; p < w; ++p)
      EXPECT_TRUE(gathered.narrow(0, p * n, n).equal(pattern(n, p, type))) << "all_gather " << p;

    // One output view per rank, one of them strided (staged and copied back).
    at::Tensor strided = at::zeros({3, 2}, type);
    std::vector<at::Tensor> outs;
    for (int p = 0; p < w; ++p)
      outs.push_back(p == 1 ? strided.select(1, 1) : at::zeros({3}, type));
    c->all_gather_into(outs, pattern(3, r, type))->wait();
    for (int p = 0; p < w; ++p)
      EXPECT_TRUE(outs[p].equal(pattern(3, p, type))) << "all_gather_into " << p;
    EXPECT_EQ(strided.select(1, 0).count_nonzero().item<int64_t>(), 0);
  }
  // Several in flight, waited in reverse: they run one after another in the order issued.
  std::vector<at::Tensor> results;
  std::vector<deepspeed::comm::WorkPtr> works;
  for (int k = 0; k < 3; ++k) {
    results.push_back(at::zeros({4 * w}));
    works.push_back(c->all_gather(results.back(), pattern(4, r, at::kFloat, k)));
    results.push_back(at::zeros({4}));
    works.push_back(
        c->reduce_scatter(results.back(), pattern(4 * w, r, at::kFloat, k), ReduceOp::Max));
  }
  for (int k = 5; k >= 0; --k) works[k]->wait();
  for (int k = 0; k < 3; ++k)
    for (int p = 0; p < w; ++p)
      EXPECT_TRUE(results[2 * k].narrow(0, p * 4, 4).equal(pattern(4, p, at::kFloat, k))) << k;
}

TEST(GlooHierarchy, EveryCollectiveOnTwoHostsOfTwoRanks) {
  dstest::run_ranks_on_hosts({"host a", "host a", "host b", "host b"}, check_collectives);
}

// Hosts whose ranks interleave, and three hosts: local index and host number are not rank / L.
TEST(GlooHierarchy, EveryCollectiveOnInterleavedAndThreeHosts) {
  dstest::run_ranks_on_hosts({"a", "b", "a", "b"}, check_collectives);
  dstest::run_ranks_on_hosts({"x", "y", "z", "x", "y", "z"}, check_collectives);
}

// The within-host phase is cut into pieces that fit the host group's shared-memory path
// (here 256 bytes: 62 floats a piece, so ~40 pieces, all in flight at once).
TEST(GlooHierarchy, TheWithinHostPhaseGoesInPiecesThatFitSharedMemory) {
  dstest::ScopedEnv limit("DS_SHM_ALLREDUCE_MAX_BYTES", "256");
  dstest::run_ranks_on_hosts({"a", "b", "a", "b"}, [](CommunicatorPtr c) {
    ASSERT_TRUE(deepspeed::comm::gloo_hierarchical(*c));
    const int r = c->rank();
    for (at::ScalarType type : {at::kFloat, at::kBFloat16}) {
      const std::vector<int64_t> splits{700, 0, 1301, 499};
      int64_t offset = 0;
      for (int p = 0; p < r; ++p) offset += splits[p];
      at::Tensor out = at::zeros({splits[r]}, type);
      c->reduce_scatter_v(out, pattern(2500, r, type), splits, ReduceOp::Sum)->wait();
      EXPECT_TRUE(out.to(at::kDouble).equal(expected(2500, 4, ReduceOp::Sum)
                                                .narrow(0, offset, splits[r])))
          << c10::toString(type);
    }
  });
}

TEST(GlooHierarchy, OnlyWhereEveryHostHasTheSameSeveralRanksAndNotWhenTurnedOff) {
  dstest::run_ranks_on_hosts({"a", "a", "b"}, [](CommunicatorPtr c) {
    EXPECT_FALSE(deepspeed::comm::gloo_hierarchical(*c));
  });
  dstest::ScopedEnv off("DS_GLOO_HIERARCHICAL", "0");
  dstest::run_ranks_on_hosts({"a", "a", "b", "b"}, [](CommunicatorPtr c) {
    EXPECT_FALSE(deepspeed::comm::gloo_hierarchical(*c));
  });
}

// A rank that leaves instead of joining: the others' waits end with CommError naming the
// collective they called (not only the phase's sub-group), no hang.
TEST(GlooHierarchy, ARankThatLeavesFailsTheOthersWaitsNamingTheirCollective) {
  std::vector<std::string> messages(4);
  dstest::run_ranks_on_hosts(
      {"a", "a", "b", "b"},
      [&](CommunicatorPtr c) {
        if (c->rank() == 3) return;  // its group closes as it returns
        at::Tensor out = at::zeros({2});
        try {
          c->reduce_scatter(out, at::ones({8}), ReduceOp::Sum)->wait();
        } catch (const deepspeed::CommError& e) {
          messages[c->rank()] = e.what();
        }
      },
      std::chrono::seconds(3));
  for (int r = 0; r < 3; ++r) {
    EXPECT_CONTAINS(messages[r], "reduce_scatter of 8 elements (float) on rank " +
                                     std::to_string(r) + " of 4");
    EXPECT_CONTAINS(messages[r], "within hosts, then across (DS_GLOO_HIERARCHICAL)");
  }
}

// ZeRO-2 and ZeRO-3 train the same as with every rank sending to every rank: the sums are
// added in another order (within each host first), so equal within rounding, not bit for bit.
TEST(GlooHierarchy, ZeroStagesTrainAsWithoutIt) {
  for (int stage : {2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    dstest::RunSpec s;
    s.world_size = 4;
    s.hosts = {"a", "a", "b", "b"};
    s.steps = 4;
    s.config = {{"train_micro_batch_size_per_gpu", 2},
                {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
                {"zero_optimization", {{"stage", stage}}}};
    bool used = false;
    s.after_training = [&](deepspeed::Engine& engine) {
      if (engine.communicator()->rank() == 0)
        used = deepspeed::comm::gloo_hierarchical(*engine.communicator());
    };
    const auto hierarchical = dstest::train_gpt(s);
    EXPECT_TRUE(used);
    dstest::ScopedEnv off("DS_GLOO_HIERARCHICAL", "0");
    const auto flat = dstest::train_gpt(s);
    ASSERT_EQ(hierarchical.losses.size(), flat.losses.size());
    for (size_t i = 0; i < flat.losses.size(); ++i)
      EXPECT_NEAR(hierarchical.losses[i], flat.losses[i], 1e-5 * std::abs(flat.losses[i])) << i;
    ASSERT_EQ(hierarchical.weights.size(), flat.weights.size());
    // Adam turns a rounding difference in a near-zero gradient into up to lr per step: 1e-5 is
    // 1% of one step (lr 1e-3), where a misrouted chunk moves weights by whole steps.
    for (size_t i = 0; i < flat.weights.size(); ++i)
      EXPECT_TRUE(hierarchical.weights[i].allclose(flat.weights[i], 1e-5, 1e-5))
          << "param " << i << " max diff "
          << (hierarchical.weights[i] - flat.weights[i]).abs().max().item<double>() << " of "
          << flat.weights[i].abs().max().item<double>() << " numel " << flat.weights[i].numel();
  }
}

}  // namespace gloo_hierarchy_test
