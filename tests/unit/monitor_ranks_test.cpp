// Who reports, and from when: the job's one reporting rank under tensor parallelism and a
// pipeline (global rank 0 as in DeepSpeed; a pipeline's last stage's first rank, which has the
// loss), the pipeline's events (only timed phases, train_loss after the step), comms_logger's
// prof_ops with DeepSpeed's operator names, and the throughput clock starting at the first
// training call rather than at the engine's construction. Ranks run as threads.
#include <gtest/gtest.h>
#include <unistd.h>

#include <functional>
#include <mutex>
#include <set>
#include <vector>

#include "deepspeed/deepspeed.h"
#include "deepspeed/pipe.h"
#include "gpt/pipeline_model.h"
#include "monitor/comm_op_names.h"
#include "monitor/training_monitor.h"
#include "runtime/engine_state.h"
#include "runtime/throughput_log.h"
#include "support/checkpoint_run.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/pipeline_gpt.h"
#include "support/ranks.h"
#include "support/training_run.h"

namespace monitor_ranks_test {

namespace dm = deepspeed::monitor;

namespace {

std::mutex mu;

nlohmann::json with_csv_monitor(nlohmann::json config, const std::string& dir) {
  config["csv_monitor"] = {{"enabled", true}, {"output_path", dir}, {"job_name", "job"}};
  config["wall_clock_breakdown"] = true;
  config["comms_logger"] = {{"enabled", true}};
  return config;
}

using dstest::occurrences;

// Micro batch 1 at data-parallel world 2 with `comms_logger` as that block; the parse's warnings go
// to `warnings` if given.
deepspeed::Config comms_logger_config(const nlohmann::json& comms_logger,
                                      std::vector<std::string>* warnings = nullptr) {
  const nlohmann::json doc = {{"train_micro_batch_size_per_gpu", 1}, {"comms_logger", comms_logger}};
  return deepspeed::parse_config(doc, 2, {}, warnings);
}

// On every rank of `comm`: three all-reduces of 4 floats, a monitor over `comm` (whose table's
// baseline they are), reset_stats() and three more. Then, on rank 0 and while the monitor lives,
// `on_rank0` with its comms table.
void reset_stats_under_a_monitor(const deepspeed::Config& config, deepspeed::comm::CommunicatorPtr comm,
                                 const std::function<void(const std::string& table)>& on_rank0) {
  at::Tensor t = torch::ones({4});
  for (int i = 0; i < 3; ++i) comm->all_reduce(t)->wait();
  dm::TrainingMonitor m(config, comm, c10::kCPU, /*writer=*/comm->rank() == 0);
  m.mark_comms_start();
  comm->reset_stats();
  for (int i = 0; i < 3; ++i) comm->all_reduce(t)->wait();
  if (comm->rank() == 0) on_rank0(m.comms_summary(/*print=*/false));
}

// Tensor 2 x data 2: every tensor rank is data-parallel rank 0 of its group, but only global
// rank 0 reports — one row per step in each file, one memory report, one comms table.
TEST(MonitorRanks, TensorParallelRanksDoNotReport) {
  dstest::TempDir dir("ds_monitor_tp");
  const int steps = 2;
  auto config = with_csv_monitor(dstest::base_config(4, 1, 1), dir.path());
  std::set<int> enabled_on;
  testing::internal::CaptureStdout();
  run_ranks(4, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto topology =
        std::make_shared<deepspeed::comm::Topology>(comm, deepspeed::comm::TopologySizes{1, 2});
    auto [model, engine, loader] = dstest::make_rank_engine(
        {.config_json = config, .topology = topology}, gpt::GPTConfig{256, 16, 1, 2, 16}, /*seed=*/7);
    ASSERT_EQ(engine->communicator()->rank(), topology->coordinates().data);
    if (engine->monitor()->enabled()) {
      std::lock_guard<std::mutex> lock(mu);
      enabled_on.insert(comm->rank());
    }
    while (engine->global_steps() < steps) {
      auto batch = loader->next();
      engine->backward(engine->forward(batch.data, batch.target));
      engine->step();
    }
    engine->see_memory_usage("asked for by every rank");
    engine->comms_summary();
  });
  const std::string printed = testing::internal::GetCapturedStdout();
  EXPECT_EQ(enabled_on, std::set<int>{0});
  const std::string loss = dstest::read_bytes(dir / "job/Train_Samples_train_loss.csv");
  EXPECT_EQ(occurrences(loss, "step,train_loss"), 1u) << loss;
  EXPECT_EQ(occurrences(loss, "\r\n"), 1u + steps) << loss;
  EXPECT_EQ(occurrences(printed, "asked for by every rank\n"), 1u) << printed;
  EXPECT_EQ(occurrences(printed, "memory after step 1\n"), 1u) << printed;
  // The engine's own table is printed once at its end, the asked-for one once: two headers.
  EXPECT_EQ(occurrences(printed, "Comm. Op            Message Size"), 2u) << printed;
}

// pipe 2 x data 2: the last stage's first rank reports; under the pipeline only
// `step` is timed, so no elapsed_time_ms_forward/backward events; train_loss and lr share the
// sample count after the step, as DeepSpeed's train_batch writes them.
TEST(MonitorRanks, PipelineReportsFromTheLastStageOnly) {
  dstest::TempDir dir("ds_monitor_pipe");
  const int steps = 2, stages = 2;
  std::set<int> enabled_on;
  int last_stage_first = -1;
  int64_t samples_per_step = 0;
  run_ranks(dstest::kPipeWorld, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto topology = std::make_shared<deepspeed::comm::Topology>(
        comm, deepspeed::comm::TopologySizes{stages, 1});
    const int data = topology->grid().data_size();
    auto args = dstest::pipeline_args(comm, stages, /*zero_stage=*/1, dstest::tiny_pipeline_gpt(false));
    args.config_json = with_csv_monitor(args.config_json, dir.path());
    args.topology = topology;
    auto engine = deepspeed::pipe::initialize_pipeline(args);
    {
      std::lock_guard<std::mutex> lock(mu);
      if (engine->monitor()->enabled()) enabled_on.insert(comm->rank());
      if (topology->coordinates() == deepspeed::comm::Coordinates{stages - 1, 0, 0})
        last_stage_first = comm->rank();
      samples_per_step = engine->train_batch_size();
    }
    const int d = topology->coordinates().data;
    for (int k = 0; k < steps; ++k) {
      int m = 0;
      engine->train_batch([&] { return dstest::pipeline_micro_batch(k, (m++) * data + d); });
    }
  });
  EXPECT_EQ(enabled_on, std::set<int>{last_stage_first});
  auto rows = [&](const std::string& name) {
    return dstest::read_bytes(dir / ("job/Train_Samples_" + name + ".csv"));
  };
  const std::string x1 = std::to_string(samples_per_step), x2 = std::to_string(2 * samples_per_step);
  EXPECT_EQ(rows("train_loss").rfind("step,train_loss\r\n" + x1 + ",", 0), 0u) << rows("train_loss");
  EXPECT_CONTAINS(rows("train_loss"), "\r\n" + x2 + ",");
  EXPECT_EQ(rows("lr").rfind("step,lr\r\n" + x1 + ",", 0), 0u) << rows("lr");
  EXPECT_EQ(rows("elapsed_time_ms_step").rfind("step,elapsed_time_ms_step\r\n" + x1 + ",", 0), 0u);
  for (const char* phase : {"forward", "backward", "backward_inner", "backward_allreduce"})
    EXPECT_EQ(::access((dir / (std::string("job/Train_Samples_elapsed_time_ms_") + phase + ".csv"))
                           .c_str(),
                       F_OK),
              -1)
        << phase;
  EXPECT_EQ(occurrences(rows("step_time_ms"), "\r\n"), 1u + steps);
}

// DeepSpeed's operator names select ours; a name that selects nothing is warned about, naming it
// and the accepted names.
TEST(MonitorRanks, ProfOpsAcceptDeepSpeedsNames) {
  std::vector<std::string> warnings;
  const deepspeed::Config config = comms_logger_config(
      {{"enabled", true},
       {"prof_all", false},
       {"prof_ops", {"all_gather_into_tensor", "reduce_scatter_tensor", "reduce"}}},
      &warnings);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_CONTAINS(warnings[0], "'comms_logger.prof_ops[2]' is \"reduce\"");
  EXPECT_CONTAINS(warnings[0], "all_gather_into_tensor");
  EXPECT_CONTAINS(warnings[0], "reduce_scatter_v");
  EXPECT_TRUE(dm::recorded_ops_named("all_to_all_single") == std::set<std::string>{"all_to_all"});

  std::string table;
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    dm::TrainingMonitor m(config, comm, c10::kCPU, /*writer=*/comm->rank() == 0);
    at::Tensor small = torch::ones({4}), big = torch::ones({8});
    comm->all_gather(big, small)->wait();
    comm->reduce_scatter_v(small, big, {4, 4})->wait();
    comm->all_reduce(small)->wait();
    if (comm->rank() == 0) table = m.comms_summary(/*print=*/false);
  });
  EXPECT_CONTAINS(table, "\nall_gather\n");
  EXPECT_CONTAINS(table, "\nreduce_scatter_v\n");
  EXPECT_EQ(table.find("all_reduce"), std::string::npos) << table;
}

// prof_all false without prof_ops selects no op (DeepSpeed's timed_op logs an op only with
// prof_all or when prof_ops names it): the table has its header and no row; with prof_all (the
// default) the same collective is listed.
TEST(MonitorRanks, ProfAllFalseWithoutProfOpsListsNothing) {
  for (bool prof_all : {false, true}) {
    const deepspeed::Config config = comms_logger_config({{"enabled", true}, {"prof_all", prof_all}});
    std::string table;
    run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
      dm::TrainingMonitor m(config, comm, c10::kCPU, /*writer=*/comm->rank() == 0);
      at::Tensor small = torch::ones({4});
      comm->all_reduce(small)->wait();
      if (comm->rank() == 0) table = m.comms_summary(/*print=*/false);
    });
    EXPECT_CONTAINS(table, "Comm. Op");
    if (prof_all)
      EXPECT_CONTAINS(table, "\nall_reduce\n");
    else
      EXPECT_EQ(table.find("all_reduce"), std::string::npos) << table;
  }
}

// A reset_stats() after the engine was built (gpt_train's, after warm-up) voids the table's
// baseline: the collectives since the reset are listed whole (before, the baseline's counts were
// subtracted from them and the row vanished).
TEST(MonitorRanks, ResetStatsAfterTheBaselineKeepsTheRowsSince) {
  const deepspeed::Config config = comms_logger_config({{"enabled", true}});
  std::string table;
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    reset_stats_under_a_monitor(config, comm, [&](const std::string& t) { table = t; });
  });
  EXPECT_CONTAINS(table, "\nall_reduce\n");
  EXPECT_CONTAINS(table, "16.0 B              3 ");
}

// The same through the desync checker (comms_check): it forwards stats_resets(), so that the
// reset voids the baseline (before, it answered 0 and the rows since the reset vanished), and
// keep_latencies(), so that the averages have the calls' latencies to trim.
TEST(MonitorRanks, CommsCheckKeepsTheTablesBaselineAndLatencies) {
  const deepspeed::Config config = comms_logger_config({{"enabled", true}});
  std::string table;
  size_t kept = 0;
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr raw) {
    reset_stats_under_a_monitor(config, deepspeed::comm::with_comms_check(raw), [&](const std::string& t) {
      table = t;
      kept = raw->stats()["all_reduce"].by_size[16].latencies_ms.size();
    });
  });
  EXPECT_CONTAINS(table, "16.0 B              3 ");
  EXPECT_EQ(kept, 3u);
}

// keep_latencies() reaches the sub-groups of the communicator it is called on, whenever they
// were split: a group split before the call (a topology's groups, which initialize() builds
// before the monitor asks), one split after it (ZeRO++'s hpZ group, built with the stage) and a
// group split from a group. Each keeps every call's latency, so that a comms table over it has
// the calls to trim. (Before, a split kept none, whatever its parent did.)
TEST(MonitorRanks, SubGroupsKeepLatenciesOfTheirParent) {
  std::mutex kept_mu;
  std::vector<size_t> kept;
  run_ranks(4, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto early = comm->split(comm->rank() % 2, comm->rank());
    auto nested = early->split(0, early->rank());
    comm->keep_latencies();
    auto late = comm->split(comm->rank() / 2, comm->rank());
    at::Tensor t = torch::ones({4});
    for (int i = 0; i < 3; ++i) {
      early->all_reduce(t)->wait();
      nested->all_reduce(t)->wait();
      late->all_reduce(t)->wait();
    }
    std::lock_guard<std::mutex> lock(kept_mu);
    for (const auto& group : {early, nested, late})
      kept.push_back(group->stats()["all_reduce"].by_size[16].latencies_ms.size());
  });
  EXPECT_EQ(kept, std::vector<size_t>(12, 3u));
}

// A sub-group's own keep_latencies() is its own: the communicator it was split from keeps none.
TEST(MonitorRanks, KeepLatenciesOfASubGroupStaysThere) {
  std::mutex kept_mu;
  std::vector<size_t> kept;
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto sub = comm->split(0, comm->rank());
    sub->keep_latencies();
    at::Tensor t = torch::ones({4});
    sub->all_reduce(t)->wait();
    comm->all_reduce(t)->wait();
    std::lock_guard<std::mutex> lock(kept_mu);
    kept.push_back(sub->stats()["all_reduce"].by_size[16].latencies_ms.size());
    kept.push_back(comm->stats()["all_reduce"].by_size[16].latencies_ms.size());
  });
  EXPECT_EQ(kept, (std::vector<size_t>{1, 0, 1, 0}));
}

// The throughput figures' first interval starts at the first training call, not at the engine's
// construction: a delay in between (a load_checkpoint) is not counted. Ordering, no durations:
// the start is after a time point taken once construction was over.
TEST(MonitorRanks, ThroughputCountsFromTheFirstTrainingCall) {
  auto model = std::make_shared<gpt::GPTImpl>(gpt::GPTConfig{256, 16, 1, 2, 16});
  auto r = deepspeed::initialize<gpt::GPTImpl>(
      {.model = model, .config_json = dstest::base_config(2, 1, 0)});
  auto& state = deepspeed::state_of(*r.engine);
  const auto constructed = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() == constructed) {
  }
  EXPECT_FALSE(state.monitor->timers().training_start().has_value());
  EXPECT_FALSE(state.log.interval_start().has_value());
  auto x = torch::randint(0, 256, {2, 16}, torch::kLong);
  r.engine->backward(r.engine->forward(x, x));
  r.engine->step();
  ASSERT_TRUE(state.monitor->timers().training_start().has_value());
  EXPECT_GT(*state.monitor->timers().training_start(), constructed);
  ASSERT_TRUE(state.log.interval_start().has_value());
  EXPECT_GT(*state.log.interval_start(), constructed);

  // The ThroughputLog alone: its first interval is the start it is given; with none, the first
  // step (which has no start) is not counted.
  deepspeed::ThroughputLog log;
  const auto given = std::chrono::steady_clock::now();
  log.start_from([given] { return std::optional<std::chrono::steady_clock::time_point>(given); });
  log.on_step({.step = 1, .samples_per_step = 8}, /*every=*/10, /*print=*/false);
  EXPECT_TRUE(log.interval_start() == given);
}

}  // namespace

}  // namespace monitor_ranks_test
