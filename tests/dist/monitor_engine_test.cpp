// The monitors and timers on a training engine: what tensorboard and csv_monitor hold equals the
// engine's own values step by step (written once, by rank 0, with the global sample count as
// x-axis); the wall_clock_breakdown parts add up to the measured step; a gpt_train killed with
// SIGKILL leaves an event file that reads back.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "deepspeed/deepspeed.h"
#include "monitor/csv_writer.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/ranks.h"
#include "support/tfevents.h"
#include "support/training_run.h"

namespace monitor_engine_test {

namespace dm = deepspeed::monitor;

namespace {

// What rank 0 saw after each optimizer step, and the time its engine calls took.
struct Seen {
  int64_t samples = 0;
  double loss = 0, lr = 0, grad_norm = 0;
  double engine_ms = 0;  // forward + backward + step calls of this optimizer step
};

// rows of a CSV monitor file: (step, value text), header checked.
std::vector<std::pair<int64_t, std::string>> csv_rows(const std::string& path,
                                                      const std::string& header) {
  std::istringstream in(dstest::read_bytes(path));
  std::string line;
  std::vector<std::pair<int64_t, std::string>> rows;
  EXPECT_TRUE(std::getline(in, line)) << path;
  EXPECT_EQ(line, "step," + header + "\r") << path;
  while (std::getline(in, line)) {
    EXPECT_EQ(line.back(), '\r');
    line.pop_back();
    const size_t comma = line.find(',');
    rows.emplace_back(std::stoll(line.substr(0, comma)), line.substr(comma + 1));
  }
  return rows;
}

// Trains the test GPT on `world` ranks (stage 2, 2 micro-batches per step, a warm-up LR schedule)
// with both monitors and the timers on, writing under `dir`.
std::vector<Seen> train_with_monitors(const std::string& dir, int world, int steps,
                                      int steps_per_print) {
  nlohmann::json config = dstest::base_config(2, 2, 2);
  config["steps_per_print"] = steps_per_print;
  config["wall_clock_breakdown"] = true;
  config["scheduler"] = {{"type", "WarmupLR"},
                         {"params", {{"warmup_min_lr", 0.0}, {"warmup_max_lr", 3e-3},
                                     {"warmup_num_steps", 4}, {"warmup_type", "linear"}}}};
  for (const char* block : {"tensorboard", "csv_monitor"})
    config[block] = {{"enabled", true}, {"output_path", dir}, {"job_name", block}};
  const gpt::GPTConfig model_config{256, 16, 2, 2, 32};
  std::vector<std::shared_ptr<gpt::GPTImpl>> models;
  for (int r = 0; r < world; ++r) {
    torch::manual_seed(7);
    models.push_back(std::make_shared<gpt::GPTImpl>(model_config));
  }
  auto data = dstest::test_text_dataset(model_config.block_size);
  std::vector<Seen> seen;
  run_ranks(world, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto [engine, optimizer, loader, scheduler] = deepspeed::initialize<gpt::GPTImpl>(
        {.model = models[comm->rank()], .config_json = config, .training_data = data, .comm = comm});
    Seen current;
    while (engine->global_steps() < steps) {
      auto batch = loader->next();
      const auto t0 = std::chrono::steady_clock::now();
      auto loss = engine->forward(batch.data, batch.target);
      engine->backward(loss);
      const bool boundary = engine->is_gradient_accumulation_boundary();
      engine->step();
      current.engine_ms +=
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (boundary && comm->rank() == 0) {
        current.samples = engine->global_samples();
        current.loss = engine->last_loss();
        current.lr = engine->get_lr()[0];
        current.grad_norm = engine->get_global_grad_norm();
        seen.push_back(current);
        current = Seen{};
      }
    }
  });  // the engines are destroyed here: the monitors flush
  return seen;
}

}  // namespace

TEST(MonitorEngine, CsvAndEventFilesHoldTheEnginesValues) {
  dstest::TempDir dir("ds_monitor_engine");
  const int steps = 6;
  const auto seen = train_with_monitors(dir.path(), 2, steps, /*steps_per_print=*/4);
  ASSERT_EQ(seen.size(), static_cast<size_t>(steps));
  EXPECT_EQ(seen[0].samples, 8);  // 2 ranks x 2 micro-batches of 2

  // CSV: DeepSpeed's files, values exactly the engine's doubles (Python repr round-trips).
  const std::string csv = dir / "csv_monitor";
  const auto loss = csv_rows(csv + "/Train_Samples_train_loss.csv", "train_loss");
  const auto lr = csv_rows(csv + "/Train_Samples_lr.csv", "lr");
  const auto norm = csv_rows(csv + "/Train_Samples_grad_norm.csv", "grad_norm");
  ASSERT_EQ(loss.size(), seen.size());
  ASSERT_EQ(lr.size(), seen.size());
  ASSERT_EQ(norm.size(), seen.size());
  // train_loss at the sample count before the step (DeepSpeed writes it in backward()); the
  // others after it.
  const int64_t batch = seen[0].samples;
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(loss[i].first, seen[i].samples - batch);
    EXPECT_EQ(lr[i].first, seen[i].samples);
    EXPECT_EQ(loss[i].second, dm::python_float_repr(seen[i].loss)) << "step " << i + 1;
    EXPECT_EQ(lr[i].second, dm::python_float_repr(seen[i].lr)) << "step " << i + 1;
    EXPECT_EQ(norm[i].second, dm::python_float_repr(seen[i].grad_norm)) << "step " << i + 1;
  }
  EXPECT_NE(lr[0].second, lr[3].second);  // the schedule moved the LR: the rows are per step
  // bf16/fp32 runs have no loss scale: no file (DeepSpeed writes it for fp16 only).
  EXPECT_TRUE(dstest::files_containing(csv, "loss_scale").empty());
  for (const char* phase : {"forward", "backward", "backward_inner", "backward_allreduce", "step"})
    EXPECT_EQ(csv_rows(csv + "/Train_Samples_elapsed_time_ms_" + phase + ".csv",
                       std::string("elapsed_time_ms_") + phase).size(), seen.size());
  // samples_per_second: the step's samples, train_batch_size = 2 ranks x 2 micro-batches of 2
  // (not one rank's, nor one micro-step's), over that step's step_time_ms.
  const auto step_ms = csv_rows(csv + "/Train_Samples_step_time_ms.csv", "step_time_ms");
  const auto rate = csv_rows(csv + "/Train_Samples_samples_per_second.csv", "samples_per_second");
  ASSERT_EQ(step_ms.size(), seen.size());
  ASSERT_EQ(rate.size(), seen.size());
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(step_ms[i].first, seen[i].samples);
    EXPECT_EQ(rate[i].first, seen[i].samples);
    const double ms = std::stod(step_ms[i].second);
    ASSERT_GT(ms, 0.0);
    EXPECT_DOUBLE_EQ(std::stod(rate[i].second), 2 * 2 * 2 * 1000.0 / ms) << "step " << i + 1;
  }

  // TensorBoard: one file (rank 0 only), the same values as float32.
  const auto files = dstest::files_containing(dir / "tensorboard", "events.out.tfevents.");
  ASSERT_EQ(files.size(), 1u);
  const auto r = dstest::read_event_file(files[0]);
  if (r.status == 3) GTEST_SKIP() << "no independent reader: " << r.output;
  ASSERT_EQ(r.status, 0) << r.output;
  auto scalars = [&](const std::string& tag) {
    return dstest::lines_starting(r.output, "scalar " + tag + " ");
  };
  const auto tb_loss = scalars("Train/Samples/train_loss");
  const auto tb_lr = scalars("Train/Samples/lr");
  ASSERT_EQ(tb_loss.size(), seen.size()) << r.output;
  ASSERT_EQ(tb_lr.size(), seen.size()) << r.output;
  auto as_float32 = [](double v) { return dm::python_float_repr(static_cast<float>(v)); };
  for (size_t i = 0; i < seen.size(); ++i) {
    const std::string step = std::to_string(seen[i].samples);
    const std::string before = std::to_string(seen[i].samples - batch);
    EXPECT_EQ(tb_loss[i],
              "scalar Train/Samples/train_loss " + before + " " + as_float32(seen[i].loss));
    EXPECT_EQ(tb_lr[i], "scalar Train/Samples/lr " + step + " " + as_float32(seen[i].lr));
  }
  EXPECT_EQ(scalars("Train/Samples/elapsed_time_ms_step").size(), seen.size());
}

// wall_clock_breakdown: per optimizer step, fwd + bwd + step (the global timers) is the time the
// engine calls took, and bwd_inner + bwd_allreduce is bwd, each within 5% (the median step: a
// rank thread preempted between the engine's timer and the test's clock shifts one step only). (The
// monitors flush only at the end here: a flush inside step() is the monitor's time, outside the
// breakdown, as in DeepSpeed.)
TEST(MonitorEngine, TimerPartsAddUpToTheMeasuredStep) {
  dstest::TempDir dir("ds_monitor_timers");
  const auto seen = train_with_monitors(dir.path(), 2, 6, /*steps_per_print=*/100);
  const std::string csv = dir / "csv_monitor";
  auto column = [&](const std::string& phase) {
    std::vector<double> v;
    for (auto& [step, value] : csv_rows(csv + "/Train_Samples_elapsed_time_ms_" + phase + ".csv",
                                        "elapsed_time_ms_" + phase))
      v.push_back(std::stod(value));
    return v;
  };
  const auto fwd = column("forward"), bwd = column("backward"), step = column("step");
  const auto inner = column("backward_inner"), reduce = column("backward_allreduce");
  ASSERT_EQ(fwd.size(), seen.size());
  std::vector<double> step_ratio, bwd_ratio;
  std::string table;
  for (size_t i = 0; i < seen.size(); ++i) {
    const double parts = fwd[i] + bwd[i] + step[i];
    step_ratio.push_back(parts / seen[i].engine_ms);
    bwd_ratio.push_back((inner[i] + reduce[i]) / bwd[i]);
    table += "step " + std::to_string(i + 1) + ": fwd+bwd+step " + std::to_string(parts) +
             " ms of " + std::to_string(seen[i].engine_ms) + " ms; bwd_inner+bwd_allreduce " +
             std::to_string(inner[i] + reduce[i]) + " of bwd " + std::to_string(bwd[i]) + "\n";
    // The timers lie inside the calls the test timed, and the two bwd parts inside bwd.
    EXPECT_LE(parts, seen[i].engine_ms) << table;
    EXPECT_LE(inner[i] + reduce[i], bwd[i]) << table;
    EXPECT_GT(fwd[i], 0.0) << table;
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return (v[(v.size() - 1) / 2] + v[v.size() / 2]) / 2;
  };
  EXPECT_NEAR(median(step_ratio), 1.0, 0.05) << table;
  EXPECT_NEAR(median(bwd_ratio), 1.0, 0.05) << table;
}

// A run killed mid-way keeps what the monitor flushed (every steps_per_print steps).
TEST(MonitorEngine, KilledRunLeavesAReadableEventFile) {
  dstest::TempDir dir("ds_monitor_kill");
  nlohmann::json config = dstest::base_config(2, 1, 1);
  config["steps_per_print"] = 1;
  std::ofstream(dir / "ds_config.json") << config.dump();
  const std::string cmd = "exec " + dstest::bin_dir() + "/gpt_train --deepspeed_config " +
                          (dir / "ds_config.json") +
                          " --n_layer 1 --n_head 2 --n_embd 32 --block_size 16 --threads 1"
                          " --steps 100000 --monitor_dir " + dir.path() + " > " + (dir / "log.txt") +
                          " 2>&1";
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Wait until at least 3 steps reached the CSV file (at most 60 s), then kill.
  const std::string loss_csv = dir / "gpt_train/Train_Samples_train_loss.csv";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  size_t rows = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (::access(loss_csv.c_str(), R_OK) == 0) {
      const std::string text = dstest::read_bytes(loss_csv);
      rows = static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
      if (rows >= 4) break;  // the header and 3 steps
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_GE(rows, 4u) << dstest::read_bytes(dir / "log.txt");
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;

  const auto files = dstest::files_containing(dir / "gpt_train", "events.out.tfevents.");
  ASSERT_EQ(files.size(), 1u);
  const auto r = dstest::read_event_file(files[0]);
  if (r.status == 3) GTEST_SKIP() << "no independent reader: " << r.output;
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_GE(dstest::lines_starting(r.output, "scalar Train/Samples/train_loss ").size(), 3u);
  EXPECT_GE(dstest::lines_starting(r.output, "scalar Train/Samples/tokens_per_second ").size(), 2u);
}

// comms_logger: the collectives ZeRO stage 2 issues per optimizer step are the textbook ones —
// the gradients (Ψ elements) reduce-scattered once, the updated parameters (Ψ) all-gathered once
// (each rank contributes Ψ/N) — plus scalar all-reduces (loss mean, gradient norm); and
// comms_summary() tabulates exactly those counts; `verbose` prints one line per collective.
TEST(MonitorEngine, CommsLoggerCountsStage2Collectives) {
  const int world = 2, steps = 3;
  nlohmann::json config = dstest::base_config(2, 1, 2);
  config["comms_logger"] = {{"enabled", true}, {"verbose", true}};
  const gpt::GPTConfig model_config{256, 16, 2, 2, 32};
  const double psi_bytes = 4.0 * dstest::count_parameters(model_config);  // fp32
  std::vector<std::shared_ptr<gpt::GPTImpl>> models;
  for (int r = 0; r < world; ++r) models.push_back(std::make_shared<gpt::GPTImpl>(model_config));
  auto data = dstest::test_text_dataset(model_config.block_size);
  std::mutex mu;
  std::string table;
  deepspeed::comm::CommStats before, after;
  testing::internal::CaptureStdout();
  run_ranks(world, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto [engine, optimizer, loader, scheduler] = deepspeed::initialize<gpt::GPTImpl>(
        {.model = models[comm->rank()], .config_json = config, .training_data = data, .comm = comm});
    const auto start = engine->communicator()->stats();
    while (engine->global_steps() < steps) {
      auto batch = loader->next();
      engine->backward(engine->forward(batch.data, batch.target));
      engine->step();
    }
    const std::string t = engine->comms_summary();
    if (comm->rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      before = start;
      after = engine->communicator()->stats();
      table = t;
    }
  });
  const std::string printed = testing::internal::GetCapturedStdout();
  auto delta = [&](const std::string& op) {
    deepspeed::comm::OpStats d;
    if (after.count(op)) d = after[op];
    if (before.count(op)) {
      d.calls -= before[op].calls;
      d.bytes -= before[op].bytes;
    }
    return d;
  };
  // Reduce-scatter: the whole flat gradient (Ψ, plus at most 1% alignment padding) per step.
  const auto rs = delta("reduce_scatter_v");
  EXPECT_GE(rs.bytes, steps * psi_bytes);
  EXPECT_LE(rs.bytes, steps * psi_bytes * 1.01);
  // All-gather: each rank contributes its partition, Ψ/N; N of them make Ψ.
  const auto ag = delta("all_gather");
  EXPECT_GE(world * ag.bytes, steps * psi_bytes);
  EXPECT_LE(world * ag.bytes, steps * psi_bytes * 1.01);
  // No full-gradient all-reduce at stage 2: only scalars (loss, norm).
  const auto ar = delta("all_reduce");
  EXPECT_LE(ar.bytes, ar.calls * 8);
  EXPECT_GE(ar.calls, steps);

  // The table: a row per op, counts summing to the calls made since initialize().
  EXPECT_CONTAINS(table, "Comm. Op            Message Size        Count");
  auto table_count = [&](const std::string& op) {
    std::istringstream in(table);
    std::string line;
    int64_t count = 0;
    bool inside = false;
    while (std::getline(in, line)) {
      if (!line.empty() && line[0] != ' ') {
        inside = line == op;
        continue;
      }
      if (!inside) continue;
      std::istringstream cols(line);
      std::string size_value, size_unit;
      int64_t n = 0;
      cols >> size_value;
      if (size_value != "0B") cols >> size_unit;
      cols >> n;
      count += n;
    }
    return count;
  };
  EXPECT_EQ(table_count("reduce_scatter_v"), rs.calls) << table;
  EXPECT_EQ(table_count("all_gather"), ag.calls) << table;
  EXPECT_EQ(table_count("all_reduce"), ar.calls) << table;

  // verbose: the observer is process-wide (one rank per process in real runs); here rank 1's
  // thread shares it, so rank 0's calls are a lower bound and both ranks' an upper one.
  const auto lines = dstest::lines_starting(printed, "[Rank 0] comm op: reduce_scatter_v | time (ms): ");
  EXPECT_GE(static_cast<int64_t>(lines.size()), rs.calls) << printed.substr(0, 2000);
  EXPECT_LE(static_cast<int64_t>(lines.size()), world * rs.calls);
}

}  // namespace monitor_engine_test
