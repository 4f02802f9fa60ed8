#include "runtime/throughput_log.h"

#include <cstdio>
#include <string>

namespace deepspeed {

void ThroughputLog::on_step(int64_t step, int64_t every, bool print, double loss,
                            const std::vector<double>& lr, double grad_norm,
                            int64_t samples_per_step) {
  ++steps_since_print_;
  if (every <= 0 || step % every != 0) return;
  auto now = std::chrono::steady_clock::now();
  double seconds = std::chrono::duration<double>(now - last_).count();
  double rate = seconds > 0 ? steps_since_print_ * samples_per_step / seconds : 0.0;
  last_ = now;
  steps_since_print_ = 0;
  if (!print) return;
  std::string lrs;
  for (size_t i = 0; i < lr.size(); ++i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s%.4g", i ? ", " : "", lr[i]);
    lrs += buf;
  }
  std::printf("[deepspeed] step=%lld loss=%.4f lr=[%s] grad_norm=%.4g samples/s=%.1f\n",
              static_cast<long long>(step), loss, lrs.c_str(), grad_norm, rate);
  std::fflush(stdout);
}

}  // namespace deepspeed
