// All-to-alls through shared memory (ShmAllReduce::all_to_all, src/comm/shm_allreduce.h), which
// Gloo communicators use when every rank is on this host (1-bit Adam's compressed all-reduce,
// qgZ's gradient exchange inside a node): every dtype, chunks of 1 element to more pieces than
// the segment has slots (small slots, so that tests stay fast), strided inputs and outputs, all
// issued before any wait together with multi-piece all-reduces; the same results and statistics
// as Gloo's alltoall (DS_SHM_ALLREDUCE=0); the size limit (DS_SHM_ALLGATHER_MAX_BYTES, shared with
// the all-gather); and a peer that leaves mid-exchange.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "comm/gloo_communicator.h"
#include "support/moved_values.h"
#include "support/ranks.h"
#include "support/scoped_env.h"
#include "support/shm_stats.h"

namespace shm_all_to_all_test {

namespace comm = deepspeed::comm;
using comm::CommunicatorPtr;
using dstest::ScopedEnv;

namespace {

constexpr char kSmallSlot[] = "4096";  // pieces of 4 KiB

struct Case {
  int64_t chunk;  // elements each rank sends to each rank
  at::ScalarType type;
};

// Rank r's whole input for case i (world chunks): values that differ by rank, chunk and case.
at::Tensor input(const Case& c, int world, int rank, int i) {
  return dstest::random_values(c.type, c.chunk * world, 104729 * rank + i);
}

// What rank `rank` must receive: chunk `rank` of every rank's input, in rank order.
at::Tensor expected(const Case& c, int world, int rank, int i) {
  std::vector<at::Tensor> parts;
  for (int r = 0; r < world; ++r)
    parts.push_back(input(c, world, r, i).narrow(0, rank * c.chunk, c.chunk));
  return at::cat(parts);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (at::ScalarType t : dstest::moved_dtypes())
    for (int64_t chunk : {int64_t{1}, int64_t{7}, int64_t{1024}, int64_t{2500}})
      out.push_back({chunk, t});
  return out;
}

// out[rank][case]: every case issued before any wait (each followed by a multi-piece
// all-reduce, checked), waited in reverse. `strided`: the input and the output are columns of
// [n, 2] grids (staged contiguous, copied back).
std::vector<std::vector<at::Tensor>> run_cases(int world, bool strided) {
  const auto all = cases();
  std::vector<std::vector<at::Tensor>> out(world);
  run_ranks(world, [&](CommunicatorPtr c) {
    const int rank = c->rank();
    std::vector<at::Tensor> results, sums;
    std::vector<comm::WorkPtr> works;
    for (size_t i = 0; i < all.size(); ++i) {
      at::Tensor in = input(all[i], world, rank, static_cast<int>(i));
      at::Tensor result = at::zeros({in.numel()}, in.options());
      if (strided) {
        at::Tensor in_grid = at::zeros({in.numel(), 2}, in.options());
        in_grid.select(1, 0).copy_(in);
        in = in_grid.select(1, 0);
        result = at::zeros({in.numel(), 2}, in.options()).select(1, 1);
      }
      results.push_back(result);
      works.push_back(c->all_to_all(results.back(), in));
      dstest::issue_all_reduce_beside(*c, sums, works);
    }
    for (auto w = works.rbegin(); w != works.rend(); ++w) (*w)->wait();
    dstest::expect_all_reduces_beside(sums, world);
    out[rank] = std::move(results);
  });
  return out;
}

// Every dtype and size, plain and strided, on 2, 3 and 4 ranks: each rank holds chunk `rank` of
// every rank's input, bit for bit, and the same as Gloo's alltoall at 2 ranks.
TEST(ShmAllToAll, EveryDtypeAndSizeEqualsTheChunksAndGloo) {
  ScopedEnv slot("DS_SHM_ALLREDUCE_SLOT_BYTES", kSmallSlot);
  const auto all = cases();
  for (int world : {2, 3, 4}) {
    for (bool strided : {false, true}) {
      const auto shm = run_cases(world, strided);
      std::vector<std::vector<at::Tensor>> gloo;
      if (world == 2) {
        ScopedEnv off("DS_SHM_ALLREDUCE", "0");
        gloo = run_cases(world, strided);
      }
      for (size_t i = 0; i < all.size(); ++i)
        for (int r = 0; r < world; ++r) {
          const std::string what = std::string(c10::toString(all[i].type)) + " chunk " +
                                   std::to_string(all[i].chunk) + " world " +
                                   std::to_string(world) + (strided ? " strided" : "") +
                                   " rank " + std::to_string(r);
          EXPECT_TRUE(shm[r][i].equal(expected(all[i], world, r, static_cast<int>(i)))) << what;
          if (world == 2) EXPECT_TRUE(shm[r][i].equal(gloo[r][i])) << what << " vs Gloo";
        }
    }
  }
}

// A rank that leaves: the other's all_to_all fails naming the shared-memory operation and its
// piece when the input is within DS_SHM_ALLGATHER_MAX_BYTES, and through Gloo above it.
TEST(ShmAllToAll, PeerThatLeavesFailsTheExchangeNamingThePiece) {
  ScopedEnv slot("DS_SHM_ALLREDUCE_SLOT_BYTES", kSmallSlot);
  auto leave = [] {
    std::string message;
    run_ranks(
        2,
        [&](CommunicatorPtr c) {
          if (c->rank() == 1) return;  // leaves without its all_to_all
          at::Tensor out = at::zeros({6 * 1024});
          try {
            c->all_to_all(out, at::ones({6 * 1024}))->wait();
            ADD_FAILURE() << "the all_to_all succeeded without its peer";
          } catch (const deepspeed::CommError& e) {
            message = e.what();
          }
        },
        std::chrono::seconds(60));
    return message;
  };
  {
    ScopedEnv limit("DS_SHM_ALLGATHER_MAX_BYTES", "24576");  // 6144 floats: 6 pieces
    const std::string through_shm = leave();
    EXPECT_NE(through_shm.find("all_to_all of 6144 elements (float) on rank 0 of 2 failed after"),
              std::string::npos)
        << through_shm;
    EXPECT_NE(through_shm.find("shared-memory all_to_all #1 (piece 1 of 6)"), std::string::npos)
        << through_shm;
    EXPECT_NE(through_shm.find("left the group"), std::string::npos) << through_shm;
  }
  ScopedEnv limit("DS_SHM_ALLGATHER_MAX_BYTES", "24572");  // one float short: Gloo
  const std::string through_gloo = leave();
  EXPECT_NE(through_gloo.find("all_to_all of 6144 elements (float) on rank 0 of 2 failed"),
            std::string::npos)
      << through_gloo;
  EXPECT_EQ(through_gloo.find("shared-memory"), std::string::npos) << through_gloo;
}

// The output may be the input itself (Gloo's path receives into a buffer of its own): the
// exchange is staged, so later pieces of the input are not overwritten before they are sent.
TEST(ShmAllToAll, InPlaceOverManyPieces) {
  ScopedEnv slot("DS_SHM_ALLREDUCE_SLOT_BYTES", kSmallSlot);
  const Case c{3000, at::kFloat};  // 3 x 3000 floats: 9 pieces, more than the 4 slots
  run_ranks(3, [&](CommunicatorPtr comm) {
    at::Tensor t = input(c, 3, comm->rank(), 0);
    comm->all_to_all(t, t)->wait();
    EXPECT_TRUE(t.equal(expected(c, 3, comm->rank(), 0))) << "rank " << comm->rank();
  });
}

TEST(ShmAllToAll, StatsCountTheSameAsGloo) {
  const auto stats = dstest::stats_without_and_with_shm([](CommunicatorPtr c) {
    for (int64_t n : {0, 2, 768, 5000}) {
      at::Tensor out = at::empty({n});
      c->all_to_all(out, at::ones({n}))->wait();
    }
    at::Tensor packed = at::zeros({18}, at::kByte);
    c->all_to_all(packed, at::ones({18}, at::kByte))->wait();
  });
  dstest::expect_counted_alike(stats, "all_to_all", 5);
}

}  // namespace

}  // namespace shm_all_to_all_test
