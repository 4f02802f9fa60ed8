// The bounded queue of launched gradient collectives every reducing stage shares. Buckets are
// finished oldest first: when more than `max_in_flight` are outstanding, and all of them at the
// end of backward. Finishing in launch order keeps every rank's sequence of waits identical.
// With overlap_comm off, max_in_flight is 0: each bucket is waited for as soon as it is launched.
#pragma once
#include <cstddef>
#include <deque>
#include <limits>

#include "deepspeed/comm.h"

namespace deepspeed {
namespace zero {

// Stages that reduce into bucket buffers of their own (reduce-scatter stages, fp32 stage 0's
// flattened all-reduce buckets, and AllReduceBuckets whose buckets travel as a copy in
// communication_data_type) hold at most this many in flight (plus the one filling): the rank
// never holds more than a few buckets of gradient.
constexpr size_t kMaxBucketsInFlight = 2;
// All-reduce stages that reduce views of a gradient buffer that exists anyway (AllReduceBuckets:
// 16-bit stage 0, an all-reducing stage 1, when the buffer's dtype is the communication dtype): nothing to bound.
constexpr size_t kUnboundedInFlight = std::numeric_limits<size_t>::max();

class InFlight {
 public:
  explicit InFlight(size_t max_in_flight) : max_(max_in_flight) {}

  // Bucket `index` was launched; finish(index) runs for the oldest while over the bound.
  template <class Finish>
  void push(size_t index, Finish&& finish) {
    queue_.push_back(index);
    while (queue_.size() > max_) pop(finish);
  }
  // Finishes every outstanding bucket, oldest first.
  template <class Finish>
  void drain(Finish&& finish) {
    while (!queue_.empty()) pop(finish);
  }
  bool empty() const { return queue_.empty(); }

 private:
  template <class Finish>
  void pop(Finish& finish) {
    const size_t index = queue_.front();
    queue_.pop_front();
    finish(index);
  }
  size_t max_;
  std::deque<size_t> queue_;
};

// For destructors: waits for a work handle still outstanding (a backward abandoned by an
// exception), swallowing its error — the first error has already been thrown.
inline void wait_quietly(comm::WorkPtr& work) {
  if (!work) return;
  try {
    work->wait();
  } catch (...) {
  }
  work.reset();
}

}  // namespace zero
}  // namespace deepspeed
