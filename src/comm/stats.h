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
    add_call(stats_[op].by_size[bytes], ms, keep_latencies_);
  }
  // One call of `ms` into `s`; its latency appended to s.latencies_ms when `keep`.
  static void add_call(SizeStats& s, double ms, bool keep) {
    s.calls += 1;
    s.total_ms += ms;
    if (ms > s.max_ms) s.max_ms = ms;
    if (keep) s.latencies_ms.push_back(ms);
  }
  // Communicator::keep_latencies: from now on every call's latency is kept.
  void keep_latencies() {
    std::lock_guard<std::mutex> lock(mu_);
    keep_latencies_ = true;
  }
  CommStats snapshot() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  // Communicator::total_ms, without copying the kept latencies.
  double total_ms(const std::string& op_prefix) const {
    std::lock_guard<std::mutex> lock(mu_);
    double ms = 0.0;
    for (const auto& [op, st] : stats_)
      if (op.rfind(op_prefix, 0) == 0)
        for (const auto& [bytes, sz] : st.by_size) ms += sz.total_ms;
    return ms;
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
  bool keep_latencies_ = false;
};

}  // namespace comm
}  // namespace deepspeed
