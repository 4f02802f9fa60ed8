// The launch rule every gradient-reducing stage shares: buckets are fixed at construction and a
// bucket is launched only when all its parameters' gradients are ready AND every earlier bucket
// has been launched. Every rank therefore issues the same collectives in the same order, whatever
// order its gradient hooks fire in — the property that keeps ranks from deadlocking.
#pragma once
#include <cstddef>
#include <vector>

namespace deepspeed {
namespace zero {

class BucketOrder {
 public:
  // bucket_of[i]: the bucket of parameter i. REQUIRES: every bucket index < num_buckets.
  BucketOrder(std::vector<size_t> bucket_of, size_t num_buckets)
      : bucket_of_(std::move(bucket_of)), size_(num_buckets, 0), ready_(num_buckets, 0) {
    for (size_t b : bucket_of_) ++size_[b];
  }
  size_t bucket_of(size_t param) const { return bucket_of_[param]; }
  // Start of a backward whose gradients will be reduced.
  void begin() {
    next_ = 0;
    ready_.assign(ready_.size(), 0);
  }
  // Parameter i's gradient is ready: launch(b) for each bucket that is now launchable, in order.
  template <class Launch>
  void mark_ready(size_t param, Launch&& launch) {
    ++ready_[bucket_of_[param]];
    while (next_ < size_.size() && ready_[next_] == size_[next_]) launch(next_++);
  }
  // End of backward: the buckets not launched yet (their parameters got no gradient, or no hooks
  // ran) go out now, in order.
  template <class Launch>
  void launch_rest(Launch&& launch) {
    while (next_ < size_.size()) launch(next_++);
  }

 private:
  std::vector<size_t> bucket_of_;
  std::vector<size_t> size_;
  std::vector<size_t> ready_;
  size_t next_ = 0;
};

}  // namespace zero
}  // namespace deepspeed
