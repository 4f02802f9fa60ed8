// The monitors' own cost, measured directly (bench/monitor_overhead.py runs it beside the
// end-to-end runs, whose noise on this shared machine is larger than the cost):
//   bench_monitor_write [steps] [dir]
// times TrainingMonitor::on_step — DeepSpeed's events for one optimizer step into tensorboard +
// csv_monitor with the timer events, a flush every 10 steps — and one start/stop pair of a
// wall-clock timer, enabled and disabled. Prints one line: monitor_write_report us_per_step=...
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench_args.h"
#include "deepspeed/comm.h"
#include "monitor/training_monitor.h"

namespace dm = deepspeed::monitor;

namespace {

double ns_per_timer_pair(bool enabled, int n) {
  dm::WallClockTimers t(enabled, c10::kCPU);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    t.start(dm::Phase::kForward);
    t.stop(dm::Phase::kForward);
  }
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / n;
}

}  // namespace

int main(int argc, char** argv) try {
  const BenchArgs args(argc, argv,
                       "Usage: bench_monitor_write [steps=2000] [dir=/tmp/bench_monitor_write]");
  args.at_most(2);
  const int steps = static_cast<int>(args.number(1, 2000));
  if (steps < 1) args.fail("steps " + std::to_string(steps) + " is not positive");
  const std::string dir = args.text(2, "/tmp/bench_monitor_write");
  deepspeed::Config c;
  for (auto* m : {&c.tensorboard, &c.csv_monitor}) {
    m->enabled = true;
    m->output_path = dir;
  }
  c.tensorboard.job_name = "tb";
  c.csv_monitor.job_name = "csv";
  c.wall_clock_breakdown = true;
  c.steps_per_print = 10;
  std::setvbuf(stdout, nullptr, _IOFBF, 1 << 20);  // the timer lines: not what is measured
  double us = 0;
  {
    dm::TrainingMonitor monitor(c, deepspeed::comm::make_single_process_communicator(),
                                c10::kCPU, /*writer=*/true);
    dm::StepRecord r;
    r.samples_per_step = 16;
    const auto t0 = std::chrono::steady_clock::now();
    for (int step = 1; step <= steps; ++step) {
      r.global_steps = step;
      r.global_samples = 16 * step;
      r.loss = 3.0 / step;
      r.lr = 1e-3;
      r.grad_norm = 0.5;
      monitor.on_step(r, /*writer=*/true);
    }
    us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
         steps;
  }
  std::fflush(stdout);
  std::fprintf(stderr,
               "monitor_write_report us_per_step=%.2f timer_pair_ns_enabled=%.1f "
               "timer_pair_ns_disabled=%.2f\n",
               us, ns_per_timer_pair(true, 1000000), ns_per_timer_pair(false, 1000000));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_monitor_write: error: %s\n", e.what());
  return 1;
}
