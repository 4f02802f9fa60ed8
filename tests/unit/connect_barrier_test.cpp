// The barrier that ends a Gloo group's setup (src/comm/connect_barrier.h), ranks as threads on one
// in-process store: it opens only when every rank has arrived, and a rank that never arrives is
// named in the error every waiting rank throws at the timeout.
#include "comm/connect_barrier.h"

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "deepspeed/errors.h"

namespace connect_barrier_test {

namespace {
using deepspeed::comm::wait_for_every_rank_connected;
using namespace std::chrono_literals;

// Runs `ranks` of a world of `world_size` through the barrier, each on its own thread; returns
// each one's error message ("" when it passed).
std::vector<std::string> run_ranks(c10d::Store& store, const std::vector<int>& ranks,
                                   int world_size, std::chrono::milliseconds timeout) {
  std::vector<std::string> errors(ranks.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        wait_for_every_rank_connected(store, ranks[i], world_size, timeout);
      } catch (const deepspeed::CommError& e) {
        errors[i] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}
}  // namespace

TEST(ConnectBarrier, OpensWhenEveryRankHasArrived) {
  c10d::HashStore store;
  const auto errors = run_ranks(store, {0, 1, 2, 3}, 4, 20s);
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(ConnectBarrier, HoldsTheEarlyRanksUntilTheLastArrives) {
  c10d::HashStore store;
  std::atomic<bool> released{false};
  std::thread early([&] {
    wait_for_every_rank_connected(store, 0, 2, 20s);
    released = true;
  });
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(released) << "rank 0 left the barrier before rank 1 arrived";
  wait_for_every_rank_connected(store, 1, 2, 20s);
  early.join();
  EXPECT_TRUE(released);
}

TEST(ConnectBarrier, TimeoutNamesTheRanksThatNeverArrived) {
  c10d::HashStore store;
  const auto errors = run_ranks(store, {0, 2}, 4, 500ms);  // ranks 1 and 3 never come
  ASSERT_EQ(errors.size(), 2u);
  for (const auto& e : errors) {
    EXPECT_NE(e.find("rank(s) 1, 3 did not finish connecting the group"), std::string::npos) << e;
  }
}

TEST(ConnectBarrier, OneRankWorldDoesNotWait) {
  c10d::HashStore store;
  EXPECT_EQ(run_ranks(store, {0}, 1, 1ms), std::vector<std::string>{""});
}

}  // namespace connect_barrier_test
