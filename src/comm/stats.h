// Per-op call and byte counters, safe to update from any thread.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "deepspeed/comm.h"

namespace deepspeed {
namespace comm {

// Whether a communicator keeps each call's latency (Communicator::keep_latencies): set on it, or
// on any communicator it was split from, at any time. The comms_logger asks the root of the
// family it reports on (StatsRecorder::family: the world); the groups split from it may exist
// already (a topology's, built before the engine's monitor) or come later (ZeRO++'s hpZ and qgZ
// groups, built with the stage), and both follow it.
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

// One communicator's counts. Recorders form families: a group's recorder is adopted by the
// recorder of the communicator it was split from (CommunicatorBase::sub_group, and a topology's
// groups of one), so that the comms_logger, handed one communicator of an engine, finds the
// world and every group split from it (tensor, pipeline, tied, ZeRO++ groups) and tabulates
// every call of this process, as DeepSpeed's process-wide comms logger does. Each call is
// recorded once, by the recorder of the group it ran on; a wrapper (the desync checker) has none.
class StatsRecorder {
 public:
  // `world_size`: the size of the group whose calls this records, the n of their bandwidths.
  explicit StatsRecorder(int world_size = 1) : world_size_(world_size) {}
  int world_size() const { return world_size_; }

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
  // `child`, the recorder of a group split from `parent`'s communicator, joins parent's family:
  // it keeps latencies whenever `parent` does (from its keep_latencies() on, before or after this
  // call) and family() lists it. REQUIRES: before the group's first collective; once per child.
  static void adopt(const std::shared_ptr<StatsRecorder>& parent,
                    const std::shared_ptr<StatsRecorder>& child) {
    if (!parent || !child || parent == child) return;
    {
      std::lock_guard<std::mutex> lock(child->mu_);
      child->keep_ = std::make_shared<KeepLatencies>(parent->keep_);
      child->parent_ = parent;
    }
    std::lock_guard<std::mutex> lock(parent->mu_);
    parent->children_.push_back(child);
  }
  // Every recorder of `member`'s family: the root it descends from (a world) first, then every
  // recorder adopted under that root at any depth, each once.
  static std::vector<std::shared_ptr<StatsRecorder>> family(std::shared_ptr<StatsRecorder> member) {
    std::vector<std::shared_ptr<StatsRecorder>> out;
    if (!member) return out;
    while (auto up = member->parent()) member = std::move(up);
    out.push_back(member);
    for (size_t i = 0; i < out.size(); ++i) {  // breadth first; a tree, so each once
      const std::shared_ptr<StatsRecorder> at = out[i];
      std::lock_guard<std::mutex> lock(at->mu_);
      out.insert(out.end(), at->children_.begin(), at->children_.end());
    }
    return out;
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
  std::shared_ptr<StatsRecorder> parent() const {
    std::lock_guard<std::mutex> lock(mu_);
    return parent_.lock();
  }

  const int world_size_;
  mutable std::mutex mu_;
  CommStats stats_;
  int64_t resets_ = 0;
  std::shared_ptr<KeepLatencies> keep_ = std::make_shared<KeepLatencies>();
  // The family (adopt). A parent holds its children, so that a group's calls stay in the table
  // after its communicator is gone (as DeepSpeed's log keeps them); a child only points back,
  // so that a world and its groups are freed together.
  std::weak_ptr<StatsRecorder> parent_;
  std::vector<std::shared_ptr<StatsRecorder>> children_;
};

}  // namespace comm
}  // namespace deepspeed
