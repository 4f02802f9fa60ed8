// The comms_logger table of an engine over a topology covers every group's collectives, as
// DeepSpeed's log_summary() covers every op through deepspeed.comm: tensor-parallel all-reduces,
// pipeline send/recv, data-parallel reductions and the world's. Each row's count is compared with
// the calls the topology's communicators themselves recorded (Communicator::stats()) between
// initialize() and the table, summed over the distinct communicators: every call counted once.
// Ranks run as threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "deepspeed/deepspeed.h"
#include "deepspeed/pipe.h"
#include "gpt/tp_model.h"
#include "monitor/comms_summary.h"
#include "support/expect.h"
#include "support/pipeline_gpt.h"
#include "support/ranks.h"
#include "support/training_run.h"

namespace comms_summary_groups_test {

namespace {

using deepspeed::comm::CommunicatorPtr;
using Counts = std::map<std::pair<std::string, std::string>, int64_t>;  // (op, size) -> calls

// The global RNG is shared by the rank threads (seeded draws happen one rank at a time), and so
// are the results.
std::mutex mu;

// (op, printed message size) -> Count, read from a comms table.
Counts table_counts(const std::string& table) {
  Counts out;
  std::istringstream in(table);
  std::string line, op;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] != ' ') {
      op = line;
      continue;
    }
    std::istringstream cols(line);
    std::string value, unit;
    int64_t count = 0;
    cols >> value;
    if (value != "0B") cols >> unit;
    cols >> count;
    out[{op, value + (unit.empty() ? "" : " " + unit)}] += count;
  }
  return out;
}

// The distinct communicators among `comms`, each once (an axis spanning the world is the world).
std::vector<CommunicatorPtr> distinct(const std::vector<CommunicatorPtr>& comms) {
  std::vector<CommunicatorPtr> out;
  for (const auto& c : comms)
    if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  return out;
}

std::vector<deepspeed::comm::CommStats> snapshot(const std::vector<CommunicatorPtr>& comms) {
  std::vector<deepspeed::comm::CommStats> out;
  for (const auto& c : comms) out.push_back(c->stats());
  return out;
}

// The completed calls per (op, printed size) from `before` to `after` of the same communicators,
// summed over them.
Counts completed(const std::vector<deepspeed::comm::CommStats>& before,
                 const std::vector<deepspeed::comm::CommStats>& after) {
  Counts out;
  for (size_t i = 0; i < after.size(); ++i)
    for (const auto& [op, s] : after[i])
      for (const auto& [bytes, sz] : s.by_size) {
        int64_t calls = sz.calls;
        auto b = before[i].find(op);
        if (b != before[i].end() && b->second.by_size.count(bytes))
          calls -= b->second.by_size.at(bytes).calls;
        if (calls > 0) out[{op, deepspeed::monitor::convert_size(bytes)}] += calls;
      }
  return out;
}

int64_t calls_of(const Counts& counts, const std::string& op) {
  int64_t n = 0;
  for (const auto& [key, c] : counts)
    if (key.first == op) n += c;
  return n;
}

}  // namespace

// tensor 2 x data 2 (TPGPT, ZeRO-1, 2 steps): the table holds the tensor group's all-reduces
// (the split layers' outputs and input gradients), the data-parallel group's reductions and the
// world's, each row's count what those communicators recorded. Before, the table held the
// data-parallel group's alone. Also under the desync checker (comms_check: every group a
// CheckedCommunicator over the recording one), whose calls are counted once, not once per layer.
TEST(CommsSummaryGroups, TensorParallelAllReducesAreTabulated) {
  const gpt::GPTConfig c{256, 16, 2, 4, 32};
  auto dataset = dstest::test_text_dataset(16);
  for (bool checked : {false, true}) {
    auto config = dstest::base_config(4, 1, 1);
    config["comms_logger"] = {{"enabled", true}};
    config["comms_check"] = checked;
    std::vector<std::string> failures;
    int64_t tp_all_reduces = 0, dp_all_reduces = 0;
    run_ranks(
        4,
        [&](CommunicatorPtr comm) {
          if (checked) comm = deepspeed::comm::with_comms_check(comm);
          auto topology = std::make_shared<deepspeed::comm::Topology>(
              comm, deepspeed::comm::TopologySizes{1, 2});
          std::shared_ptr<gpt::TPGPTImpl> model;
          {
            std::lock_guard<std::mutex> lock(mu);
            torch::manual_seed(7);
            model = std::make_shared<gpt::TPGPTImpl>(c, topology->tensor_parallel());
          }
          auto [engine, optimizer, loader, scheduler] =
              deepspeed::initialize<gpt::TPGPTImpl>({.model = model,
                                                     .config_json = config,
                                                     .training_data = dataset,
                                                     .topology = topology});
          const auto comms = distinct({topology->world(), topology->data_parallel(),
                                       topology->tensor_parallel(), topology->pipe_parallel()});
          const auto before = snapshot(comms);
          const auto tp_before = snapshot({topology->tensor_parallel()});
          const auto dp_before = snapshot({topology->data_parallel()});
          while (engine->global_steps() < 2) {
            auto batch = loader->next();
            engine->backward(engine->forward(batch.data, batch.target));
            engine->step();
          }
          const std::string table = engine->comms_summary();
          const Counts want = completed(before, snapshot(comms));
          const Counts got = table_counts(table);
          std::lock_guard<std::mutex> lock(mu);
          if (got != want)
            failures.push_back("rank " + std::to_string(comm->rank()) + ":\n" + table);
          if (comm->rank() == 0) {
            tp_all_reduces = calls_of(completed(tp_before, snapshot({topology->tensor_parallel()})),
                                      "all_reduce");
            dp_all_reduces =
                calls_of(completed(dp_before, snapshot({topology->data_parallel()})), "all_reduce");
          }
        },
        std::chrono::seconds(60));
    EXPECT_TRUE(failures.empty()) << "comms_check " << checked << ", " << failures.front();
    // The tensor group did all-reduce (its rows are not the data-parallel group's).
    EXPECT_GT(tp_all_reduces, 0) << "comms_check " << checked;
    EXPECT_GT(dp_all_reduces, 0) << "comms_check " << checked;
  }
}

// pipe 2 x data 2 (the tiny pipeline GPT, ZeRO-1, one train_batch): the pipeline group's
// send/recv rows are in the table (stage 0 sends activations and receives gradients; the last
// stage the reverse), with the counts the pipeline group recorded. Before, no send or recv row.
TEST(CommsSummaryGroups, PipelineSendRecvAreTabulated) {
  const int stages = 2;
  std::vector<std::string> failures;
  int64_t sends = 0, recvs = 0, table_sends = 0, table_recvs = 0;
  run_ranks(
      dstest::kPipeWorld,
      [&](CommunicatorPtr comm) {
        auto topology = std::make_shared<deepspeed::comm::Topology>(
            comm, deepspeed::comm::TopologySizes{stages, 1});
        auto args =
            dstest::pipeline_args(comm, stages, /*zero_stage=*/1, dstest::tiny_pipeline_gpt(false));
        args.config_json["comms_logger"] = {{"enabled", true}};
        args.topology = topology;
        auto engine = deepspeed::pipe::initialize_pipeline(args);
        const auto comms = distinct({topology->world(), topology->data_parallel(),
                                     topology->tensor_parallel(), topology->pipe_parallel()});
        const auto before = snapshot(comms);
        const auto pipe_before = snapshot({topology->pipe_parallel()});
        dstest::train_pipeline_steps(*engine, comm, 0, 1);
        const std::string table = engine->comms_summary();
        const Counts want = completed(before, snapshot(comms));
        const Counts got = table_counts(table);
        const Counts pipe = completed(pipe_before, snapshot({topology->pipe_parallel()}));
        std::lock_guard<std::mutex> lock(mu);
        if (got != want) failures.push_back("rank " + std::to_string(comm->rank()) + ":\n" + table);
        if (comm->rank() == 0) {
          sends = calls_of(pipe, "send");
          recvs = calls_of(pipe, "recv");
          table_sends = calls_of(got, "send");
          table_recvs = calls_of(got, "recv");
        }
      },
      std::chrono::seconds(60));
  EXPECT_TRUE(failures.empty()) << failures.front();
  EXPECT_GT(sends, 0);
  EXPECT_GT(recvs, 0);
  EXPECT_EQ(table_sends, sends);
  EXPECT_EQ(table_recvs, recvs);
}

}  // namespace comms_summary_groups_test
