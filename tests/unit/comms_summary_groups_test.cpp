// The comms_logger table over several groups: a row (op, message size) mixing groups of different
// sizes computes each call's bandwidths with its own group's n and trims each list on its own, as
// DeepSpeed's log_all; the debug table (the process-wide observer) does the same; a topology's
// groups of one belong to the world's stats family (they keep latencies when it does, and the
// table counts their calls).
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "comm/op_observer.h"
#include "comm/stats.h"
#include "deepspeed/config.h"
#include "deepspeed/topology.h"
#include "monitor/comms_summary.h"
#include "monitor/training_monitor.h"
#include "support/expect.h"
#include "support/fake_communicator.h"
#include "support/ranks.h"

namespace comms_summary_groups_test {

namespace dm = deepspeed::monitor;

namespace {

// The columns of a row after the op's name, each padded to 20 as the table pads them.
std::string row(const std::vector<std::string>& cells) {
  std::string out = std::string(20, ' ');
  for (const auto& c : cells) out += c + std::string(20 - c.size(), ' ');
  return out;
}

// comms_logger on, micro batch 1 at data-parallel world 2, with `extra` keys in the block.
deepspeed::Config comms_logger_config(const nlohmann::json& extra = nlohmann::json::object()) {
  nlohmann::json block = {{"enabled", true}};
  block.update(extra);
  return deepspeed::parse_config({{"train_micro_batch_size_per_gpu", 1}, {"comms_logger", block}},
                                 2, {});
}

}  // namespace

// 1 MiB all-reduces: 9 on a group of 2 (7 at 1 ms, one at 1.15 ms, one at 0.5 ms) and one on a
// group of 8 at 1.2 ms. At 1 ms, size/t = 8.388608 Gbps; all-reduce algbw = 2·size/t whatever n,
// busbw = size/t·2(n−1)/n: ×1 for n = 2, ×1.75 for n = 8. Ten calls: trim_mean drops one value at
// each end of each list, each list sorted on its own:
//   latency: drops 0.5 and 1.2 ->  (7 + 1.15) / 8                          = 1.01875 -> 1.02
//   algbw:   drops 1.2's 13.98 and 0.5's 33.55 -> (7·16.777 + 16.777/1.15) / 8 = 16.5037 -> 16.50
//   busbw:   drops 1.15's 7.29 (n = 2) and 0.5's 16.78 -> (7·8.389 + 8.389·1.75/1.2) / 8
//                                                                          = 8.8692 -> 8.87
// The slowest call (n = 8) has a high busbw, so the busbw trim keeps it where the latency trim
// drops it; with one n for the row (or the latency's trim for every list) busbw would read 8.25
// (n = 2 for all: 8.25; n = 8 for all: 14.44).
TEST(CommsSummaryGroups, RowMixingGroupSizesTakesEachCallsN) {
  deepspeed::comm::StatsRecorder pair(2), eight(8);
  pair.keep_latencies();
  eight.keep_latencies();
  for (int i = 0; i < 7; ++i) pair.add_latency("all_reduce", 1048576, 1.0);
  pair.add_latency("all_reduce", 1048576, 1.15);
  pair.add_latency("all_reduce", 1048576, 0.5);
  eight.add_latency("all_reduce", 1048576, 1.2);
  EXPECT_EQ(pair.world_size(), 2);
  const std::string table = dm::comms_summary_table({{pair.snapshot(), 2}, {eight.snapshot(), 8}});
  EXPECT_CONTAINS(table, "\nall_reduce\n" + row({"1.0 MB", "10", "9.85", "1.02", "16.50", "8.87"}));
  // The same groups' calls of another op stay in their own row.
  pair.add_latency("broadcast", 1048576, 1.0);
  EXPECT_CONTAINS(dm::comms_summary_table({{pair.snapshot(), 2}, {eight.snapshot(), 8}}),
                  "\nbroadcast\n" + row({"1.0 MB", "1", "1.00", "1.00", "8.39", "8.39"}));
}

// comms_logger.debug tabulates the process-wide observer's calls, which come from every group:
// each with its own group's size (before, every call counted against the monitor's
// communicator: both at n = 2, busbw 8.39). Two 1 MiB all-reduces at 1 ms, on groups of 2 and
// 4: busbw 8.39 and 12.58, averaged 10.49.
TEST(CommsSummaryGroups, DebugTableTakesEachCallsN) {
  auto comm = std::make_shared<dstest::FakeCommunicator>(0, 2);
  dm::TrainingMonitor m(comms_logger_config({{"debug", true}}), comm, c10::kCPU, /*writer=*/true);
  m.mark_comms_start();
  deepspeed::comm::notify_op_observer("all_reduce", 1048576, 1.0, 2);
  deepspeed::comm::notify_op_observer("all_reduce", 1048576, 1.0, 4);
  EXPECT_CONTAINS(m.comms_summary(/*print=*/false),
                  "\nall_reduce\n" + row({"1.0 MB", "2", "2.00", "1.00", "16.78", "10.49"}));
}

// A topology axis of size 1 gets a group of one without a split; it is still a member of the
// world's family: keep_latencies() on the world reaches it (before, it kept none whatever the
// world did), and a table over any group of the topology counts its calls (and the world's).
TEST(CommsSummaryGroups, TopologyGroupsOfOneJoinTheWorldsFamily) {
  std::mutex mu;
  std::vector<size_t> kept;
  std::string table;
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr world) {
    // tensor 2 = the world; data and pipe axes of size 1.
    deepspeed::comm::Topology topology(world, deepspeed::comm::TopologySizes{1, 2});
    ASSERT_EQ(topology.data_parallel()->world_size(), 1);
    ASSERT_EQ(topology.tensor_parallel(), world);
    world->keep_latencies();
    at::Tensor t = torch::ones({4});
    topology.data_parallel()->all_reduce(t)->wait();
    std::lock_guard<std::mutex> lock(mu);
    kept.push_back(topology.data_parallel()->stats()["all_reduce"].by_size[16].latencies_ms.size());
    // Recorded once, by the group it ran on: not by the world it was taken from.
    kept.push_back(static_cast<size_t>(world->stats()["all_reduce"].calls));
  });
  EXPECT_EQ(kept, (std::vector<size_t>{1, 0, 1, 0}));

  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr world) {
    deepspeed::comm::Topology topology(world, deepspeed::comm::TopologySizes{1, 2});
    // The engine's monitor is handed the data-parallel group (here, the group of one).
    dm::TrainingMonitor m(comms_logger_config(), topology.data_parallel(), c10::kCPU,
                          /*writer=*/world->rank() == 0);
    m.mark_comms_start();
    at::Tensor t = torch::ones({4});
    topology.data_parallel()->all_reduce(t)->wait();
    topology.tensor_parallel()->all_reduce(t)->wait();
    topology.tensor_parallel()->all_reduce(t)->wait();
    if (world->rank() == 0) table = m.comms_summary(/*print=*/false);
  });
  // 3 calls: 1 on the group of one, 2 on the world (tensor group); each counted once.
  EXPECT_CONTAINS(table, "\nall_reduce\n                    16.0 B              3 ");
}

}  // namespace comms_summary_groups_test
