// Per-op call and byte counters, safe to update from any thread.
#pragma once
#include <cstdint>
#include <mutex>
#include <string>

#include "deepspeed/comm.h"

namespace deepspeed {
namespace comm {

class StatsRecorder {
 public:
  void add(const std::string& op, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    OpStats& s = stats_[op];
    s.calls += 1;
    s.bytes += bytes;
  }
  // A collective of `bytes` finished `ms` after it was launched.
  void add_latency(const std::string& op, int64_t bytes, double ms) {
    std::lock_guard<std::mutex> lock(mu_);
    SizeStats& s = stats_[op].by_size[bytes];
    s.calls += 1;
    s.total_ms += ms;
    s.inv_ms_sum += inverse_ms(ms);
    if (ms > s.max_ms) s.max_ms = ms;
  }
  // 1/ms for the mean bandwidth; a latency the clock could not tell from 0 counts as 1 ns.
  static double inverse_ms(double ms) { return 1.0 / (ms > 1e-6 ? ms : 1e-6); }
  CommStats snapshot() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void reset() {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.clear();
    ++resets_;
  }
  int64_t resets() const {
    std::lock_guard<std::mutex> lock(mu_);
    return resets_;
  }

 private:
  mutable std::mutex mu_;
  CommStats stats_;
  int64_t resets_ = 0;
};

}  // namespace comm
}  // namespace deepspeed
