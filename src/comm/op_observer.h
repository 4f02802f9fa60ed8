// comms_logger.verbose: a process-wide observer told of every completed collective (DeepSpeed's
// comms logger is process-wide too). At most one at a time; the monitor of the rank that prints
// sets it and clears it. With none set, a collective pays one relaxed atomic load.
// Thread-safe: collectives complete on whichever thread waits for them.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace deepspeed {
namespace comm {

// op, bytes of the tensor the op was named with, latency from launch to completion in ms, and
// the world size of its communicator.
using OpObserver = std::function<void(const std::string&, int64_t, double, int)>;

namespace detail {
struct OpObserverSlot {
  std::mutex mu;
  std::shared_ptr<const OpObserver> observer;
  std::atomic<bool> set{false};
};
inline OpObserverSlot& op_observer_slot() {
  static OpObserverSlot slot;
  return slot;
}
}  // namespace detail

// Replaces the observer (nullptr clears it).
inline void set_op_observer(std::shared_ptr<const OpObserver> observer) {
  auto& slot = detail::op_observer_slot();
  std::lock_guard<std::mutex> lock(slot.mu);
  slot.set.store(observer != nullptr, std::memory_order_relaxed);
  slot.observer = std::move(observer);
}

// Clears the observer if it is still `observer`.
inline void clear_op_observer(const std::shared_ptr<const OpObserver>& observer) {
  auto& slot = detail::op_observer_slot();
  std::lock_guard<std::mutex> lock(slot.mu);
  if (slot.observer != observer) return;
  slot.observer = nullptr;
  slot.set.store(false, std::memory_order_relaxed);
}

// Whether an observer is set now (one relaxed load): a backend that pays to time its collectives
// (NCCL: the host waits for the GPU) pays only then.
inline bool op_observer_set() {
  return detail::op_observer_slot().set.load(std::memory_order_relaxed);
}

inline void notify_op_observer(const std::string& op, int64_t bytes, double ms, int world_size) {
  auto& slot = detail::op_observer_slot();
  if (!slot.set.load(std::memory_order_relaxed)) return;
  std::shared_ptr<const OpObserver> observer;
  {
    std::lock_guard<std::mutex> lock(slot.mu);
    observer = slot.observer;
  }
  if (observer) (*observer)(op, bytes, ms, world_size);
}

}  // namespace comm
}  // namespace deepspeed
