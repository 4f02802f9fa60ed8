#include "monitor/wall_clock.h"

#include <torch/cuda.h>

#include <cstdio>

namespace deepspeed {
namespace monitor {
namespace {

int index(Phase p) { return static_cast<int>(p); }

std::string format_line(const char* const* names, const double* values, const bool* present,
                        const char* suffix) {
  std::string line = "time (ms)";
  for (int i = 0; i < kPhaseCount; ++i) {
    if (!present[i]) continue;
    char buf[96];
    std::snprintf(buf, sizeof buf, " | %s%s: %.2f", names[i], suffix, values[i]);
    line += buf;
  }
  return line;
}

}  // namespace

const char* phase_name(Phase p) {
  static const char* const kNames[] = {"fwd", "bwd", "bwd_inner", "bwd_allreduce", "step"};
  return kNames[index(p)];
}

const char* phase_event_name(Phase p) {
  static const char* const kNames[] = {"forward", "backward", "backward_inner",
                                       "backward_allreduce", "step"};
  return kNames[index(p)];
}

void WallClockTimers::synchronize() const {
  if (device_.is_cuda()) torch::cuda::synchronize(device_.has_index() ? device_.index() : -1);
}

void WallClockTimers::start_slow(Phase p) {
  synchronize();
  started_[index(p)] = Clock::now();
  running_[index(p)] = true;
}

void WallClockTimers::stop_slow(Phase p) {
  const int i = index(p);
  if (!running_[i]) return;  // a phase that threw before its start is not counted
  synchronize();
  const std::chrono::duration<double, std::milli> ms = Clock::now() - started_[i];
  running_[i] = false;
  this_step_[i] += ms.count();
  this_timed_[i] = true;
  interval_sum_[i] += ms.count();
  interval_micro_[i] += 1;
}

void WallClockTimers::end_optimizer_step() {
  if (!enabled_) return;
  last_step_ = this_step_;
  last_timed_ = this_timed_;
  this_step_.fill(0.0);
  this_timed_.fill(false);
  ++interval_steps_;
}

std::vector<std::string> WallClockTimers::interval_lines() {
  std::vector<std::string> lines;
  if (!enabled_ || interval_steps_ == 0) return lines;
  const char* names[kPhaseCount];
  double micro[kPhaseCount], global[kPhaseCount];
  bool present[kPhaseCount];
  for (int i = 0; i < kPhaseCount; ++i) {
    names[i] = phase_name(static_cast<Phase>(i));
    present[i] = interval_micro_[i] > 0;
    micro[i] = present[i] ? interval_sum_[i] / interval_micro_[i] : 0.0;
    global[i] = interval_sum_[i] / interval_steps_;
  }
  lines.push_back(format_line(names, micro, present, "_microstep"));
  lines.push_back(format_line(names, global, present, ""));
  interval_sum_.fill(0.0);
  interval_micro_.fill(0);
  interval_steps_ = 0;
  return lines;
}

}  // namespace monitor
}  // namespace deepspeed
