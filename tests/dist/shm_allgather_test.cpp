// All-gathers through shared memory (ShmAllReduce::all_gather, src/comm/shm_allreduce.h), which
// Gloo communicators use for all_gather and all_gather_into when every rank is on this host:
// every dtype (moved as bytes, bool and uint8 included), sizes of 1, odd, and many pieces
// (small slots, so that tests stay fast), in place or not, strided outputs, all issued before any
// wait and waited in reverse, mixed with multi-piece all-reduces; the same results and statistics
// as the Gloo path (DS_SHM_ALLREDUCE=0); the size limit; and a peer that leaves mid-gather.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <thread>
#include <vector>

#include "comm/gloo_communicator.h"
#include "comm/shm_segment.h"
#include "support/moved_values.h"
#include "support/ranks.h"
#include "support/scoped_env.h"
#include "support/shm_stats.h"

namespace shm_allgather_test {

namespace comm = deepspeed::comm;
using comm::CommunicatorPtr;
using dstest::ScopedEnv;

namespace {

// Pieces of 4 KiB: 1024 fp32 of each rank's chunk.
constexpr char kSmallSlot[] = "4096";

struct Case {
  int64_t numel;  // of each rank's chunk
  at::ScalarType type;
};

// Rank r's chunk for case i: values that differ between ranks and cases, the same in every run.
at::Tensor chunk(const Case& c, int rank, int i) {
  return dstest::random_values(c.type, c.numel, 7919 * rank + i);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (at::ScalarType t : dstest::moved_dtypes())
    // 1, odd, one piece of 4 KiB exactly for fp32, several pieces with a partial last one, and
    // more pieces than the segment's 4 slots.
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1024}, int64_t{2500}, int64_t{9000}})
      out.push_back({n, t});
  return out;
}

// What every rank's output of case i must be: the chunks of ranks 0..world-1, in order.
at::Tensor expected(const Case& c, int world, int i) {
  std::vector<at::Tensor> parts;
  for (int r = 0; r < world; ++r) parts.push_back(chunk(c, r, i));
  return at::cat(parts);
}

enum class Form { kAllGather, kInPlace, kStrided, kInto };

std::string describe(const Case& c, Form f, int world) {
  static const char* forms[] = {"all_gather", "all_gather in place", "all_gather strided",
                                "all_gather_into"};
  return std::string(forms[static_cast<int>(f)]) + " " + c10::toString(c.type) +
         " n=" + std::to_string(c.numel) + " world " + std::to_string(world);
}

// out[rank][case] of every case in form `f`, all issued before any wait, waited in reverse. Each
// case also all-reduces a multi-piece tensor issued right after it (checked: its exact sum).
std::vector<std::vector<at::Tensor>> run_cases(int world, Form f) {
  const auto all = cases();
  std::vector<std::vector<at::Tensor>> out(world);
  run_ranks(world, [&](CommunicatorPtr c) {
    const int rank = c->rank();
    std::vector<at::Tensor> results, sums;
    std::vector<comm::WorkPtr> works;
    for (size_t i = 0; i < all.size(); ++i) {
      const Case& k = all[i];
      at::Tensor mine = chunk(k, rank, static_cast<int>(i));
      const int64_t n = k.numel;
      if (f == Form::kAllGather) {
        results.push_back(at::full({world * n}, 1, k.type));
        works.push_back(c->all_gather(results.back(), mine));
      } else if (f == Form::kInPlace) {
        results.push_back(at::zeros({world * n}, k.type));
        results.back().narrow(0, rank * n, n).copy_(mine);
        works.push_back(c->all_gather(results.back(), results.back().narrow(0, rank * n, n)));
      } else if (f == Form::kStrided) {  // a column of a [world * n, 2] grid: staged, copied back
        at::Tensor grid = at::zeros({world * n, 2}, k.type);
        results.push_back(grid.select(1, 1));
        works.push_back(c->all_gather(results.back(), mine));
      } else {  // all_gather_into: every rank's chunk into one row of a [world, n + 3] grid
        at::Tensor grid = at::zeros({world, n + 3}, k.type);
        std::vector<at::Tensor> views;
        for (int r = 0; r < world; ++r) views.push_back(grid[r].narrow(0, 1, n));
        works.push_back(c->all_gather_into(views, mine));
        results.push_back(grid);
      }
      dstest::issue_all_reduce_beside(*c, sums, works);
    }
    for (auto w = works.rbegin(); w != works.rend(); ++w) (*w)->wait();
    dstest::expect_all_reduces_beside(sums, world);
    for (size_t i = 0; i < all.size(); ++i) {
      if (f == Form::kInto) {  // the rows' margins untouched, their middles compared
        const int64_t n = all[i].numel;
        const at::Tensor grid = results[i];
        EXPECT_TRUE(grid.narrow(1, 0, 1).equal(at::zeros({world, 1}, grid.options())));
        EXPECT_TRUE(grid.narrow(1, n + 1, 2).equal(at::zeros({world, 2}, grid.options())));
        results[i] = grid.narrow(1, 1, n).reshape({-1});
      }
    }
    out[rank] = std::move(results);
  });
  return out;
}

TEST(ShmAllGather, OnForLocalGroupsWithItsOwnLimit) {
  {
    ScopedEnv limit("DS_SHM_ALLGATHER_MAX_BYTES", "12345");
    run_ranks(2, [](CommunicatorPtr c) { EXPECT_EQ(comm::shm_allgather_limit(*c), 12345u); });
  }
  ScopedEnv off("DS_SHM_ALLREDUCE", "0");
  run_ranks(2, [](CommunicatorPtr c) { EXPECT_EQ(comm::shm_allgather_limit(*c), 0u); });
}

TEST(ShmAllGather, BadLimitIsNamed) {
  ScopedEnv bad("DS_SHM_ALLGATHER_MAX_BYTES", "lots");
  try {
    run_ranks(2, [](CommunicatorPtr) {}, std::chrono::seconds(5));
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("DS_SHM_ALLGATHER_MAX_BYTES"), std::string::npos)
        << e.what();
  }
}

// Every dtype, size and form, outstanding, on 2, 3 and 4 ranks: every rank holds every chunk,
// bit for bit, as the Gloo path does.
TEST(ShmAllGather, EveryFormAndDtypeEqualsTheChunksAndGloo) {
  ScopedEnv slot("DS_SHM_ALLREDUCE_SLOT_BYTES", kSmallSlot);
  ScopedEnv max("DS_SHM_ALLREDUCE_MAX_BYTES", "1073741824");
  const auto all = cases();
  for (int world : {2, 3, 4}) {
    for (Form f : {Form::kAllGather, Form::kInPlace, Form::kStrided, Form::kInto}) {
      const auto shm = run_cases(world, f);
      std::vector<std::vector<at::Tensor>> gloo;
      if (world == 2) {
        ScopedEnv off("DS_SHM_ALLREDUCE", "0");
        gloo = run_cases(world, f);
      }
      for (size_t i = 0; i < all.size(); ++i) {
        const at::Tensor want = expected(all[i], world, static_cast<int>(i));
        for (int r = 0; r < world; ++r) {
          ASSERT_EQ(shm[r][i].scalar_type(), all[i].type) << describe(all[i], f, world);
          EXPECT_TRUE(shm[r][i].equal(want)) << describe(all[i], f, world) << " rank " << r;
          if (world == 2)
            EXPECT_TRUE(shm[r][i].equal(gloo[r][i])) << describe(all[i], f, world) << " vs Gloo";
        }
      }
    }
  }
}

// Gathers larger than DS_SHM_ALLGATHER_MAX_BYTES keep to Gloo. Told apart by how a rank that
// leaves fails the other: the shared-memory path names itself and the piece.
TEST(ShmAllGather, PeerThatLeavesFailsTheGatherNamingThePiece) {
  ScopedEnv slot("DS_SHM_ALLREDUCE_SLOT_BYTES", kSmallSlot);
  auto leave = [](int64_t numel) {
    std::string message;
    run_ranks(
        2,
        [&](CommunicatorPtr c) {
          if (c->rank() == 1) return;  // leaves without its all_gather
          at::Tensor out = at::zeros({2 * numel});
          try {
            c->all_gather(out, at::ones({numel}))->wait();
            ADD_FAILURE() << "the all_gather succeeded without its peer";
          } catch (const deepspeed::CommError& e) {
            message = e.what();
          }
        },
        std::chrono::seconds(60));
    return message;
  };
  {
    ScopedEnv limit("DS_SHM_ALLGATHER_MAX_BYTES", "81920");  // 2 x 10240 floats
    const std::string through_shm = leave(10 * 1024);  // 10 pieces
    EXPECT_NE(through_shm.find("all_gather of 10240 elements (float) on rank 0 of 2 failed after"),
              std::string::npos)
        << through_shm;
    EXPECT_NE(through_shm.find("shared-memory all_gather #1 (piece 1 of 10)"), std::string::npos)
        << through_shm;
    EXPECT_NE(through_shm.find("left the group"), std::string::npos) << through_shm;
  }
  ScopedEnv limit("DS_SHM_ALLGATHER_MAX_BYTES", "81916");  // one float short: Gloo
  const std::string through_gloo = leave(10 * 1024);
  EXPECT_NE(through_gloo.find("all_gather of 10240 elements (float) on rank 0 of 2 failed"),
            std::string::npos)
      << through_gloo;
  EXPECT_EQ(through_gloo.find("shared-memory"), std::string::npos) << through_gloo;
}

TEST(ShmAllGather, StatsCountTheSameAsGloo) {
  const auto stats = dstest::stats_without_and_with_shm([](CommunicatorPtr c) {
    for (int64_t n : {0, 1, 768, 5000}) {
      at::Tensor out = at::empty({2 * n});
      c->all_gather(out, at::ones({n}))->wait();
    }
    at::Tensor grid = at::zeros({2, 9}, at::kBFloat16);
    c->all_gather_into({grid[0], grid[1]}, at::ones({9}, at::kBFloat16))->wait();
  });
  dstest::expect_counted_alike(stats, "all_gather", 5);
}

}  // namespace

}  // namespace shm_allgather_test
