// The peer watch (src/comm/peer_watch.h) of several ranks side by side on one in-process store:
// a rank that stops beating is named, with its host, by every other rank; and only rank 0 reads
// the per-rank counters, so the store's load grows with the world size, not its square.
#include "comm/peer_watch.h"

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <atomic>
#include <chrono>
#include <regex>
#include <thread>

namespace peer_watch_test {

namespace {
using deepspeed::comm::PeerWatch;
using namespace std::chrono_literals;

// Counts the reads of the per-rank counters ("ds_peer/beat/<r>").
class CountingStore : public c10d::HashStore {
 public:
  std::vector<uint8_t> get(const std::string& key) override {
    if (key.rfind("ds_peer/beat/", 0) == 0) ++counter_reads;
    return c10d::HashStore::get(key);
  }
  std::atomic<int64_t> counter_reads{0};
};

std::vector<std::shared_ptr<PeerWatch>> start_watches(const c10::intrusive_ptr<CountingStore>& store,
                                                      int world, std::chrono::milliseconds beat) {
  std::vector<std::shared_ptr<PeerWatch>> watches;
  for (int r = 0; r < world; ++r) {
    watches.push_back(std::make_shared<PeerWatch>(store, r, world, "10.0.0." + std::to_string(r), beat));
    watches.back()->start();
  }
  return watches;
}

int64_t beats_of_rank0(c10d::Store& store) {
  const auto v = store.get("ds_peer/beat/0");
  return std::stoll(std::string(v.begin(), v.end()));
}

TEST(PeerWatch, EveryOtherRankNamesTheSilentRankWithItsHost) {
  auto store = c10::make_intrusive<CountingStore>();
  auto watches = start_watches(store, 3, 20ms);
  std::this_thread::sleep_for(150ms);
  for (auto& w : watches) EXPECT_EQ(w->report(), "") << "everyone beats";

  watches[1]->stop();
  const std::regex names_rank1(R"(^; not heard from for up to [0-9.]+ s: rank 1 \(host .+ 10\.0\.0\.1\)$)");
  std::string r0, r2;
  for (int i = 0; i < 150; ++i) {  // silent after 3 beats; rank 2 learns it a beat later
    std::this_thread::sleep_for(20ms);
    r0 = watches[0]->report();
    r2 = watches[2]->report();
    if (!r0.empty() && !r2.empty()) break;
  }
  EXPECT_TRUE(std::regex_match(r0, names_rank1)) << r0;
  EXPECT_TRUE(std::regex_match(r2, names_rank1)) << "rank 2 reads rank 0's summary: " << r2;
  for (auto& w : watches) w->stop();
}

TEST(PeerWatch, OnlyRankZeroReadsTheCounters) {
  const int world = 8;
  auto store = c10::make_intrusive<CountingStore>();
  auto watches = start_watches(store, world, 10ms);
  std::this_thread::sleep_for(300ms);
  for (auto& w : watches) w->stop();
  std::this_thread::sleep_for(30ms);  // a beat in flight finishes
  const int64_t beats = beats_of_rank0(*store);
  ASSERT_GT(beats, 5);
  // Every rank reading every counter would be about world·world reads a beat.
  EXPECT_LE(store->counter_reads.load(), world * (beats + 1))
      << beats << " beats of rank 0, " << store->counter_reads.load() << " counter reads";
}

}  // namespace

}  // namespace peer_watch_test
