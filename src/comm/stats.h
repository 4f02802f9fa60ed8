// Per-op call and byte counters, safe to update from any thread.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "deepspeed/comm.h"

namespace deepspeed {
namespace comm {

// Whether a communicator keeps each call's latency (Communicator::keep_latencies): set on it, or
// on any communicator it was split from, at any time. The comms_logger asks the communicator it
// reports on; the groups split from it may exist already (a topology's, built before the
// engine's monitor) or come later (ZeRO++'s hpZ and qgZ groups, built with the stage), and
// both follow it.
class KeepLatencies {
 public:
  explicit KeepLatencies(std::shared_ptr<const KeepLatencies> parent = nullptr)
      : parent_(std::move(parent)) {}
  void set() { on_.store(true); }
  bool on() const { return on_.load() || (parent_ && parent_->on()); }

 private:
  std::atomic<bool> on_{false};
  // The flag of the communicator this one was split from (null: a world): a sub-group does not
  // hold its parent's stats alive, only this.
  const std::shared_ptr<const KeepLatencies> parent_;
};

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
    add_call(stats_[op].by_size[bytes], ms, keep_->on());
  }
  // One call of `ms` into `s`; its latency appended to s.latencies_ms when `keep`.
  static void add_call(SizeStats& s, double ms, bool keep) {
    s.calls += 1;
    s.total_ms += ms;
    if (ms > s.max_ms) s.max_ms = ms;
    if (keep) s.latencies_ms.push_back(ms);
  }
  // Communicator::keep_latencies: from now on every call's latency is kept, here and in every
  // recorder that follows this one.
  void keep_latencies() { keep_->set(); }
  // Whether each call's latency is kept now (here or by a recorder this one follows).
  bool keeps_latencies() const { return keep_->on(); }
  // A sub-group's recorder: keeps latencies whenever `parent`'s does (from its keep_latencies()
  // on, before or after this call). REQUIRES: before the sub-group's first collective.
  void follow_keep_latencies_of(const StatsRecorder& parent) {
    keep_ = std::make_shared<KeepLatencies>(parent.keep_);
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
  std::shared_ptr<KeepLatencies> keep_ = std::make_shared<KeepLatencies>();
};

}  // namespace comm
}  // namespace deepspeed
