#include "runtime/throughput_log.h"

#include <cstdio>
#include <string>

namespace deepspeed {

void ThroughputLog::on_step(const StepLogLine& line, int64_t every, bool print) {
  const int64_t step = line.step;
  const auto& lr = line.lr;
  if (!last_ && training_start_) last_ = training_start_();
  if (last_) {
    ++steps_since_print_;
  } else {
    last_ = Clock::now();  // no known start: this step is not counted
  }
  if (every <= 0 || step % every != 0) return;
  if (print && enabled_ && synchronize_) synchronize_();
  auto now = Clock::now();
  double seconds = std::chrono::duration<double>(now - *last_).count();
  double rate = seconds > 0 ? steps_since_print_ * line.samples_per_step / seconds : 0.0;
  last_ = now;
  steps_since_print_ = 0;
  if (!print) return;
  std::string lrs;
  for (size_t i = 0; i < lr.size(); ++i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s%.4g", i ? ", " : "", lr[i]);
    lrs += buf;
  }
  char scale[48] = "";
  if (line.loss_scale > 0) std::snprintf(scale, sizeof scale, " loss_scale=%.6g", line.loss_scale);
  char throughput[48] = "";
  if (enabled_) std::snprintf(throughput, sizeof throughput, " samples/s=%.1f", rate);
  std::printf("[deepspeed] step=%lld skipped=%lld loss=%.4f lr=[%s] grad_norm=%.4g%s%s\n",
              static_cast<long long>(step), static_cast<long long>(line.skipped), line.loss,
              lrs.c_str(), line.grad_norm, scale, throughput);
  std::fflush(stdout);
}

}  // namespace deepspeed
