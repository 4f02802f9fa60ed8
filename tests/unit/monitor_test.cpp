// The monitors' file formats: TensorBoard event files (encoded without protobuf,
// src/monitor/tensorboard_event.cpp) read back by an independent reader (Python protobuf from
// src/monitor/proto/tensorboard_event.proto, CRCs checked in Python), DeepSpeed's CSV layout, the
// comms_logger table arithmetic and the wall-clock timer lines; and the monitor blocks' errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <sstream>

#include "comm/stats.h"
#include "deepspeed/deepspeed.h"
#include "deepspeed/errors.h"
#include "deepspeed/monitor.h"
#include "monitor/comms_summary.h"
#include "monitor/csv_writer.h"
#include "monitor/tensorboard_writer.h"
#include "monitor/tfrecord.h"
#include "monitor/training_monitor.h"
#include "monitor/wall_clock.h"
#include "support/expect.h"
#include "support/fake_communicator.h"
#include "support/files.h"
#include "support/tfevents.h"
#include "support/training_run.h"

namespace monitor_test {

namespace dm = deepspeed::monitor;

namespace {

// What the reader prints for a scalar: the value as float32, as Python prints it.
std::string scalar_line(const std::string& tag, int64_t step, double value) {
  return "scalar " + tag + " " + std::to_string(step) + " " +
         dm::python_float_repr(static_cast<double>(static_cast<float>(value)));
}

// The comms table of 1 MiB all-reduced on 2 ranks, once per latency in `latencies_ms`.
std::string mib_all_reduce_table(const std::vector<double>& latencies_ms) {
  deepspeed::comm::StatsRecorder r;
  r.keep_latencies();
  for (double ms : latencies_ms) r.add_latency("all_reduce", 1048576, ms);
  return dm::comms_summary_table(r.snapshot(), 2);
}

// The columns of a row after the op's name, each padded to 20 as the table pads them.
std::string row(const std::vector<std::string>& cells) {
  std::string out = std::string(20, ' ');
  for (const auto& c : cells) out += c + std::string(20 - c.size(), ' ');
  return out;
}

// Latencies of 1, 2, ..., n ms and one `outlier`.
std::vector<double> one_to(int n, double outlier) {
  std::vector<double> v;
  for (int i = 1; i <= n; ++i) v.push_back(i);
  v.push_back(outlier);
  return v;
}

// A communicator whose collectives complete after the latencies the test names.
class TimedCommunicator : public dstest::FakeCommunicator {
 public:
  TimedCommunicator() : FakeCommunicator(0, 2) {}
  void complete(const std::string& op, int64_t bytes, double ms) {
    stats_->add_latency(op, bytes, ms);
  }
};

}  // namespace

TEST(MonitorFormat, PythonFloatReprMatchesPython) {
  const std::pair<double, const char*> cases[] = {
      {0.001, "0.001"},       {65536.0, "65536.0"},     {1e-05, "1e-05"},
      {0.0001, "0.0001"},     {1e16, "1e+16"},          {1e15, "1000000000000000.0"},
      {2.5e16, "2.5e+16"},    {0.1 + 0.2, "0.30000000000000004"},
      {-0.5, "-0.5"},         {0.0, "0.0"},             {123456789.0, "123456789.0"},
      {3.14159, "3.14159"},   {1.5e-300, "1.5e-300"},   {-2e+20, "-2e+20"},
  };
  for (const auto& [value, python] : cases) EXPECT_EQ(dm::python_float_repr(value), python);
  EXPECT_EQ(dm::python_float_repr(std::nan("")), "nan");
}

TEST(MonitorFormat, MaskedCrcIsTensorFlows) {
  // crc32c("") = 0, so the masked value is the mask constant itself.
  EXPECT_EQ(dm::masked_crc32c("", 0), 0xa282ead8u);
  // crc32c("123456789") = 0xe3069283, rotated right by 15 and offset.
  const uint32_t crc = 0xe3069283u;
  EXPECT_EQ(dm::masked_crc32c("123456789", 9), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
  std::string rec;
  dm::append_tfrecord(rec, "abc");
  ASSERT_EQ(rec.size(), 8u + 4 + 3 + 4);
  EXPECT_EQ(rec.substr(0, 8), std::string("\x03\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(rec.substr(12, 3), "abc");
}

TEST(MonitorFormat, EventFileName) {
  EXPECT_EQ(dm::event_file_name(1700000000, "node1", 42, 0),
            "events.out.tfevents.1700000000.node1.42.0");
  EXPECT_EQ(dm::event_file_name(7, "h", 1, 3), "events.out.tfevents.0000000007.h.1.3");
}

TEST(MonitorFormat, CsvFilesAreDeepSpeeds) {
  dstest::TempDir dir("ds_monitor_csv");
  {
    dm::CsvWriter csv(dir.path());
    csv.add_scalar("Train/Samples/train_loss", 2.5, 8);
    csv.add_scalar("Train/Samples/lr", 1e-05, 8);
    csv.add_scalar("Train/Samples/train_loss", 2.25, 16);
    // Buffered: nothing on disk before flush().
    EXPECT_TRUE(dstest::files_containing(dir.path(), ".csv").empty());
    csv.flush();
    EXPECT_EQ(dstest::read_bytes(dir / "Train_Samples_train_loss.csv"),
              "step,train_loss\r\n8,2.5\r\n16,2.25\r\n");
    csv.add_scalar("Train/Samples/train_loss", 2.0, 24);
    csv.add_scalar("my metric", 7.0, 24);
  }  // the destructor flushes
  EXPECT_EQ(dstest::read_bytes(dir / "Train_Samples_train_loss.csv"),
            "step,train_loss\r\n8,2.5\r\n16,2.25\r\n24,2.0\r\n");
  EXPECT_EQ(dstest::read_bytes(dir / "Train_Samples_lr.csv"), "step,lr\r\n8,1e-05\r\n");
  EXPECT_EQ(dstest::read_bytes(dir / "my_metric.csv"), "step,my metric\r\n24,7.0\r\n");
}

TEST(MonitorFormat, EventFileReadsBackWithPythonProtobuf) {
  dstest::TempDir dir("ds_monitor_tb");
  std::vector<std::string> expected = {"file_version brain.Event:2"};
  std::string path;
  {
    dm::TensorBoardWriter tb(dir.path());
    const double values[] = {2.7183, 1e-5, 65536.0, 0.1, -3.5, 1e20};
    int64_t step = 0;
    for (double v : values) {
      step += 16;
      tb.add_scalar("Train/Samples/train_loss", v, step);
      tb.add_scalar("Train/Samples/lr", v / 10, step);
      expected.push_back(scalar_line("Train/Samples/train_loss", step, v));
      expected.push_back(scalar_line("Train/Samples/lr", step, v / 10));
      if (step == 48) tb.flush();
    }
    path = tb.path();
  }
  expected.push_back("records " + std::to_string(expected.size()));
  ASSERT_EQ(dstest::files_containing(dir.path(), "events.out.tfevents.").size(), 1u);
  const auto r = dstest::read_event_file(path);
  if (r.status == 3) GTEST_SKIP() << "no independent reader: " << r.output;
  ASSERT_EQ(r.status, 0) << r.output;
  std::vector<std::string> lines = dstest::lines_starting(r.output, "");
  EXPECT_EQ(lines, expected);
}

TEST(MonitorFormat, NoScalarsNoEventFile) {
  dstest::TempDir dir("ds_monitor_tb_none");
  {
    dm::TensorBoardWriter tb(dir.path());
    tb.flush();
    EXPECT_EQ(tb.path(), "");
  }
  EXPECT_TRUE(dstest::files_containing(dir.path(), "events.out.tfevents.").empty());
}

TEST(MonitorFormat, ReaderDetectsACorruptedRecord) {
  dstest::TempDir dir("ds_monitor_tb_bad");
  std::string path;
  {
    dm::TensorBoardWriter tb(dir.path());
    tb.add_scalar("Train/Samples/train_loss", 1.0, 1);
    path = tb.path();
  }
  std::string bytes = dstest::read_bytes(path);
  bytes[bytes.size() - 6] ^= 0x01;  // inside the last record's Event bytes
  dstest::write_bytes(path, bytes);
  const auto r = dstest::read_event_file(path);
  if (r.status == 3) GTEST_SKIP() << "no independent reader: " << r.output;
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_CONTAINS(r.output, "data checksum mismatch");
}

TEST(MonitorConfig, OutputPathThatCannotBeCreatedNamesKeyAndPath) {
  dstest::TempDir dir("ds_monitor_err");
  dstest::write_bytes(dir / "a_file", "x");
  for (const char* key : {"tensorboard", "csv_monitor"}) {
    deepspeed::Config c;
    deepspeed::MonitorConfig& m = std::string(key) == "tensorboard" ? c.tensorboard : c.csv_monitor;
    m.enabled = true;
    m.output_path = dir / "a_file";
    m.job_name = "job";
    const std::string msg = dstest::message_of<deepspeed::ConfigError>(
        [&] { dm::make_monitor(c, /*writer=*/true); });
    EXPECT_CONTAINS(msg, std::string("config key '") + key + ".output_path'");
    EXPECT_CONTAINS(msg, dir / "a_file/job");
  }
}

TEST(MonitorConfig, OnlyTheWriterCreatesFiles) {
  dstest::TempDir dir("ds_monitor_writer");
  EXPECT_FALSE(dm::make_monitor(deepspeed::Config{}, /*writer=*/true)->enabled());  // default: off
  deepspeed::Config c;
  c.tensorboard.enabled = c.csv_monitor.enabled = true;
  c.tensorboard.output_path = c.csv_monitor.output_path = dir.path();
  c.tensorboard.job_name = "tb";
  c.csv_monitor.job_name = "csv";
  auto quiet = dm::make_monitor(c, /*writer=*/false);
  EXPECT_FALSE(quiet->enabled());
  quiet->write_events({{"x", 1.0, 1}});
  quiet->flush();
  EXPECT_TRUE(dstest::files_containing(dir.path(), "").size() == 2u);  // only . and ..
  auto writer = dm::make_monitor(c, /*writer=*/true);
  EXPECT_TRUE(writer->enabled());
  writer->write_events({{"Train/Samples/lr", 0.5, 8}});
  writer->flush();
  EXPECT_EQ(dstest::read_bytes(dir / "csv/Train_Samples_lr.csv"), "step,lr\r\n8,0.5\r\n");
  EXPECT_EQ(dstest::files_containing(dir / "tb", "events.out.tfevents.").size(), 1u);
}

TEST(CommsSummary, SizesAndBandwidthsAreDeepSpeeds) {
  EXPECT_EQ(dm::convert_size(0), "0B");
  EXPECT_EQ(dm::convert_size(512), "512.0 B");
  EXPECT_EQ(dm::convert_size(1024), "1.0 KB");
  EXPECT_EQ(dm::convert_size(1536), "1.5 KB");
  EXPECT_EQ(dm::convert_size(3932160), "3.75 MB");
  // 1 MB in 1 ms on 4 ranks: all_reduce algbw = 2·size/t, busbw = size/t·2(n−1)/n.
  const double mb = 1e6;
  auto [ar_alg, ar_bus] = dm::bandwidth_gbps("all_reduce", mb, 1.0, 4);
  EXPECT_DOUBLE_EQ(ar_alg, 16.0);  // 2e6 B/ms = 2e9 B/s = 16 Gbit/s
  EXPECT_DOUBLE_EQ(ar_bus, 12.0);
  auto [ag_alg, ag_bus] = dm::bandwidth_gbps("all_gather", mb, 1.0, 4);
  EXPECT_DOUBLE_EQ(ag_alg, 32.0);
  EXPECT_DOUBLE_EQ(ag_bus, 24.0);
  // all_to_all (DeepSpeed's all_to_all_single): algbw = size/t, busbw = size/t·(n−1)/n.
  auto [aa_alg, aa_bus] = dm::bandwidth_gbps("all_to_all", mb, 1.0, 4);
  EXPECT_DOUBLE_EQ(aa_alg, 8.0);
  EXPECT_DOUBLE_EQ(aa_bus, 6.0);
  // reduce_scatter(_v): `size` is the whole input, multiplied by n as DeepSpeed does.
  auto [rs_alg, rs_bus] = dm::bandwidth_gbps("reduce_scatter_v", mb, 1.0, 4);
  EXPECT_DOUBLE_EQ(rs_alg, 32.0);
  EXPECT_DOUBLE_EQ(rs_bus, 24.0);
  auto [bc_alg, bc_bus] = dm::bandwidth_gbps("broadcast", mb, 2.0, 4);
  EXPECT_DOUBLE_EQ(bc_alg, 4.0);
  EXPECT_DOUBLE_EQ(bc_bus, 4.0);
}

TEST(CommsSummary, TableHasOneRowPerOpAndSize) {
  deepspeed::comm::CommStats stats;
  auto& ar = stats["all_reduce"];
  ar.by_size[1024] = {3, 6.0, 3.0, {1.0, 2.0, 3.0}};
  ar.by_size[8] = {1, 0.5, 0.5, {0.5}};
  auto& rs = stats["reduce_scatter"];
  // 4096: the whole input, as DeepSpeed's reduce_scatter_tensor row.
  rs.by_size[4096] = {2, 4.0, 2.0, {2.0, 2.0}};
  stats["barrier"].calls = 5;        // no sized calls: no rows
  const std::string t = dm::comms_summary_table(stats, 2);
  const auto lines = dstest::lines_starting(t, "");
  ASSERT_EQ(lines.size(), 6u) << t;
  EXPECT_EQ(lines[0].rfind("Comm. Op            Message Size        Count", 0), 0u) << lines[0];
  EXPECT_EQ(lines[1], "all_reduce");
  EXPECT_CONTAINS(lines[2], "8.0 B");  // ascending sizes
  EXPECT_CONTAINS(lines[3], "1.0 KB              3                   6.00                2.00");
  EXPECT_EQ(lines[4], "reduce_scatter");
  EXPECT_CONTAINS(lines[5], "4.0 KB              2                   4.00                2.00");
  EXPECT_EQ(dm::comms_summary_table(stats, 2, {"reduce_scatter"}).find("all_reduce"),
            std::string::npos);
}

// The bandwidth columns are the mean of each call's bandwidth, as DeepSpeed's log_all averages
// the per-call values calc_bw_log gave: 1 MiB all-reduced on 2 ranks in 1 ms and in 9 ms is
// 16.78 and 1.86 Gbps algbw (8.39 and 0.93 busbw), 9.32 and 4.66 on average (the bandwidth of
// the mean latency, 5 ms, would be 3.36 and 1.68).
TEST(CommsSummary, BandwidthsAreTheMeanOfEachCalls) {
  deepspeed::comm::StatsRecorder r;
  r.keep_latencies();
  r.add_latency("all_reduce", 1048576, 1.0);
  r.add_latency("all_reduce", 1048576, 9.0);
  const std::string t = dm::comms_summary_table(r.snapshot(), 2);
  EXPECT_CONTAINS(t, "1.0 MB              2                   10.00               5.00      "
                    "          9.32                4.66");
}

// DeepSpeed's log_all prints Count and Total Latency over every call and, for Avg Latency and
// the two bandwidths, trim_mean(list, 0.1): sorted, k = round(0.1·n) dropped at each end with
// Python's round (half to even). 10 calls of 1..9 ms and one of 1000 ms: k = 1, the mean of 2..9
// ms is 5.50 ms and of their bandwidths 3.84 / 1.92 Gbps (the plain means: 104.50 ms, 4.75 / 2.37).
TEST(CommsSummary, AveragesAreDeepSpeedsTrimmedMeans) {
  EXPECT_CONTAINS(mib_all_reduce_table(one_to(9, 1000.0)),
                  row({"1.0 MB", "10", "1045.00", "5.50", "3.84", "1.92"}));
  // 5 calls: round(0.5) = 0, nothing dropped (half up would drop the 2 and the 1000 ms: 6.00 ms).
  EXPECT_CONTAINS(mib_all_reduce_table({2.0, 4.0, 6.0, 8.0, 1000.0}),
                  row({"1.0 MB", "5", "1020.00", "204.00", "3.50", "1.75"}));
  // 25 calls: round(2.5) = 2 (half up: 3, algbw 1.64); 1..24 ms and 1000 ms keep 3..23 ms.
  EXPECT_CONTAINS(mib_all_reduce_table(one_to(24, 1000.0)),
                  row({"1.0 MB", "25", "1300.00", "13.00", "1.79", "0.89"}));
  // 15 calls: 0.1·15 is 1.5000000000000002 in binary, so 2 either way; 1..14 ms and 1000 ms.
  EXPECT_CONTAINS(mib_all_reduce_table(one_to(14, 1000.0)),
                  row({"1.0 MB", "15", "1105.00", "8.00", "2.56", "1.28"}));
}

// The engine's table counts from mark_comms_start (initialize's own broadcasts left out): the
// latencies kept before it are not among the ones averaged. Calls before the monitor existed are
// not kept at all (no comms_logger then); the count and total leave them out as well.
TEST(CommsSummary, TrimmedMeansLeaveOutTheCallsBeforeTheBaseline) {
  deepspeed::Config c;
  c.comms_logger.enabled = true;
  auto comm = std::make_shared<TimedCommunicator>();
  comm->complete("all_reduce", 1048576, 500.0);  // before the monitor: not kept
  dm::TrainingMonitor m(c, comm, c10::kCPU, /*writer=*/true);
  comm->complete("all_reduce", 1048576, 2000.0);  // kept, before the baseline
  comm->complete("all_reduce", 1048576, 3000.0);
  m.mark_comms_start();
  for (double ms : one_to(9, 1000.0)) comm->complete("all_reduce", 1048576, ms);
  EXPECT_EQ(comm->stats()["all_reduce"].by_size[1048576].latencies_ms.size(), 12u);
  EXPECT_CONTAINS(m.comms_summary(/*print=*/false),
                  row({"1.0 MB", "10", "1045.00", "5.50", "3.84", "1.92"}));
}

// A one-rank job's table has its collectives, as DeepSpeed's comms logger times ops on a group
// of one: the single-process communicator times them like the others.
TEST(CommsSummary, WorldSizeOneHasItsCollectives) {
  deepspeed::Config c;
  c.comms_logger.enabled = true;
  auto comm = deepspeed::comm::make_single_process_communicator();
  dm::TrainingMonitor m(c, comm, c10::kCPU, /*writer=*/true);
  m.mark_comms_start();
  at::Tensor t = at::ones({256});
  for (int i = 0; i < 3; ++i) comm->all_reduce(t)->wait();
  at::Tensor out = at::zeros({256});
  comm->reduce_scatter_v(out, t, {256})->wait();
  const std::string table = m.comms_summary(/*print=*/false);
  EXPECT_CONTAINS(table, "\nall_reduce\n" + row({"1.0 KB", "3"}));
  EXPECT_CONTAINS(table, "\nreduce_scatter_v\n" + row({"1.0 KB", "1"}));
}

TEST(WallClock, LinesInDeepSpeedsFormat) {
  dm::WallClockTimers off(false, c10::kCPU);
  off.start(dm::Phase::kForward);
  off.stop(dm::Phase::kForward);
  off.end_optimizer_step();
  EXPECT_TRUE(off.interval_lines().empty());

  dm::WallClockTimers t(true, c10::kCPU);
  for (int micro = 0; micro < 2; ++micro) {
    for (int p = 0; p < dm::kPhaseCount; ++p) {
      t.start(static_cast<dm::Phase>(p));
      t.stop(static_cast<dm::Phase>(p));
    }
  }
  t.stop(dm::Phase::kStep);  // not running: ignored
  t.end_optimizer_step();
  const auto lines = t.interval_lines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].rfind("time (ms) | fwd_microstep: ", 0), 0u) << lines[0];
  EXPECT_CONTAINS(lines[0], " | bwd_microstep: ");
  EXPECT_CONTAINS(lines[0], " | bwd_inner_microstep: ");
  EXPECT_CONTAINS(lines[0], " | bwd_allreduce_microstep: ");
  EXPECT_CONTAINS(lines[0], " | step_microstep: ");
  EXPECT_EQ(lines[1].rfind("time (ms) | fwd: ", 0), 0u) << lines[1];
  EXPECT_CONTAINS(lines[1], " | bwd_allreduce: ");
  EXPECT_TRUE(t.interval_lines().empty());  // the interval was reset
}

// The engine-facing monitor: DeepSpeed's events per optimizer step (loss scale with fp16 only,
// timer events with wall_clock_breakdown), flushed every steps_per_print steps.
TEST(TrainingMonitor, WritesDeepSpeedsEventsAndFlushesEveryStepsPerPrint) {
  dstest::TempDir dir("ds_training_monitor");
  deepspeed::Config c;
  c.csv_monitor.enabled = true;
  c.csv_monitor.output_path = dir.path();
  c.csv_monitor.job_name = "job";
  c.wall_clock_breakdown = true;
  c.steps_per_print = 2;
  auto comm = deepspeed::comm::make_single_process_communicator();
  {
    dm::TrainingMonitor m(c, comm, c10::kCPU, /*writer=*/true);
    dm::StepRecord r;
    r.fp16 = true;
    r.samples_per_step = 32;
    for (int step = 1; step <= 3; ++step) {
      m.timers().start(dm::Phase::kForward);
      m.timers().stop(dm::Phase::kForward);
      r.global_steps = step;
      r.global_samples = 32 * step;
      r.loss = 4.0 - step;
      r.lr = 1e-3 * step;
      r.loss_scale = 65536.0 / step;
      r.grad_norm = 0.5;
      m.on_step(r, /*writer=*/true);
      const bool flushed = ::access((dir / "job/Train_Samples_train_loss.csv").c_str(), R_OK) == 0;
      EXPECT_EQ(flushed, step >= 2) << "step " << step;
    }
  }  // the rest at destruction
  // train_loss at the sample count before the step, as DeepSpeed writes it in backward(); lr and
  // loss_scale after it, as DeepSpeed's step() writes them.
  EXPECT_EQ(dstest::read_bytes(dir / "job/Train_Samples_train_loss.csv"),
            "step,train_loss\r\n0,3.0\r\n32,2.0\r\n64,1.0\r\n");
  EXPECT_EQ(dstest::read_bytes(dir / "job/Train_Samples_loss_scale.csv"),
            "step,loss_scale\r\n32,65536.0\r\n64,32768.0\r\n96,21845.333333333332\r\n");
  EXPECT_EQ(dstest::read_bytes(dir / "job/Train_Samples_lr.csv"),
            "step,lr\r\n32,0.001\r\n64,0.002\r\n96,0.003\r\n");
  auto exists = [&](const std::string& name) {
    return ::access((dir / ("job/Train_Samples_" + name + ".csv")).c_str(), R_OK) == 0;
  };
  for (const char* name :
       {"grad_norm", "step_time_ms", "samples_per_second", "elapsed_time_ms_forward"})
    EXPECT_TRUE(exists(name)) << name;
  // Only the phases that were timed have events (a pipeline times only `step`): no zeros
  // standing for phases that did not run under the timers.
  for (const char* name : {"elapsed_time_ms_backward", "elapsed_time_ms_backward_inner",
                           "elapsed_time_ms_backward_allreduce", "elapsed_time_ms_step"})
    EXPECT_FALSE(exists(name)) << name;
  EXPECT_EQ(dstest::read_bytes(dir / "job/Train_Samples_elapsed_time_ms_forward.csv")
                .rfind("step,elapsed_time_ms_forward\r\n32,", 0),
            0u);
  // samples_per_second is the step's samples (samples_per_step, 32) over its step_time_ms, row
  // for row (Python reprs: the doubles round-trip).
  auto rows = [&](const std::string& name) {
    std::istringstream in(dstest::read_bytes(dir / ("job/Train_Samples_" + name + ".csv")));
    std::string line;
    std::getline(in, line);
    EXPECT_EQ(line, "step," + name + "\r");
    std::vector<std::pair<int64_t, double>> out;
    while (std::getline(in, line)) {
      const size_t comma = line.find(',');
      out.emplace_back(std::stoll(line.substr(0, comma)), std::stod(line.substr(comma + 1)));
    }
    return out;
  };
  const auto step_ms = rows("step_time_ms"), rate = rows("samples_per_second");
  ASSERT_EQ(step_ms.size(), 3u);
  ASSERT_EQ(rate.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(step_ms[i].first, 32 * static_cast<int64_t>(i + 1));
    EXPECT_EQ(rate[i].first, step_ms[i].first);
    ASSERT_GT(step_ms[i].second, 0.0);
    EXPECT_DOUBLE_EQ(rate[i].second, 32 * 1000.0 / step_ms[i].second) << "step " << i + 1;
  }
}

TEST(CommsSummary, VerboseLineIsDeepSpeeds) {
  EXPECT_EQ(dm::verbose_line("all_reduce", 1000000, 1.0, 4),
            "comm op: all_reduce | time (ms): 1.00 | msg size: 976.56 KB | algbw (Gbps): 16.00 | "
            "busbw (Gbps): 12.00");
  // reduce_scatter: DeepSpeed's size is the whole input (deepspeed.comm's `tensor` argument of
  // reduce_scatter_tensor), and calc_bw_log multiplies it by n: algbw 2·4096 B / 2 ms.
  EXPECT_EQ(dm::verbose_line("reduce_scatter", 4096, 2.0, 2),
            "comm op: reduce_scatter | time (ms): 2.00 | msg size: 4.0 KB | algbw (Gbps): 0.03 | "
            "busbw (Gbps): 0.02");
}

// The monitor blocks' bad values reach the user from parse_config / initialize(), naming them.
TEST(MonitorConfig, BadBlocksAreErrorsNamingTheKey) {
  auto error_of = [](const nlohmann::json& extra) {
    nlohmann::json doc = {{"train_micro_batch_size_per_gpu", 2}};
    doc.merge_patch(extra);
    return dstest::message_of<deepspeed::ConfigError>(
        [&] { deepspeed::parse_config(doc, 1); });
  };
  EXPECT_CONTAINS(error_of({{"tensorboard", {{"enabled", true}, {"output_dir", "x"}}}}),
                  "unknown config key 'tensorboard.output_dir'");
  EXPECT_CONTAINS(error_of({{"csv_monitor", {{"enabled", "yes please"}}}}), "'csv_monitor.enabled'");
  EXPECT_CONTAINS(error_of({{"comms_logger", {{"prof_ops", "all_reduce"}}}}),
                  "'comms_logger.prof_ops'");

  // An output_path that cannot be created fails initialize(), before any training.
  dstest::TempDir dir("ds_monitor_init");
  dstest::write_bytes(dir / "file", "x");
  auto config = dstest::base_config(2, 1, 0);
  config["csv_monitor"] = {{"enabled", true}, {"output_path", dir / "file"}};
  auto model = std::make_shared<gpt::GPTImpl>(gpt::GPTConfig{256, 16, 1, 2, 16});
  const std::string msg = dstest::message_of<deepspeed::ConfigError>(
      [&] { deepspeed::initialize<gpt::GPTImpl>({.model = model, .config_json = config}); });
  EXPECT_CONTAINS(msg, "config key 'csv_monitor.output_path'");
  EXPECT_CONTAINS(msg, dir / "file/DeepSpeedJobName");
}

}  // namespace monitor_test
