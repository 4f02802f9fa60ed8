// The launch rule every gradient-reducing stage shares: buckets are fixed at construction and a
// bucket is launched only when all its parameters' gradients are ready AND every earlier bucket
// has been launched. Every rank therefore issues the same collectives in the same order, whatever
// order its gradient hooks fire in — the property that keeps ranks from deadlocking. A parameter
// the backward's graph cannot reach is ready from its start (mark_unreachable), so that it holds
// back no bucket.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "deepspeed/errors.h"

namespace deepspeed {
namespace zero {

class BucketOrder {
 public:
  // bucket_of[i]: the bucket of parameter i. REQUIRES: every bucket index < num_buckets.
  BucketOrder(std::vector<size_t> bucket_of, size_t num_buckets)
      : bucket_of_(std::move(bucket_of)), size_(num_buckets, 0), ready_(num_buckets, 0),
        marked_(bucket_of_.size(), false), unreachable_(bucket_of_.size(), false) {
    for (size_t b : bucket_of_) ++size_[b];
  }
  size_t bucket_of(size_t param) const { return bucket_of_[param]; }
  // Start of a backward whose gradients will be reduced.
  void begin() {
    next_ = 0;
    ready_.assign(ready_.size(), 0);
    marked_.assign(marked_.size(), false);
    unreachable_.assign(unreachable_.size(), false);
  }
  // Parameter i's gradient is ready: launch(b) for each bucket that is now launchable, in order.
  // A second gradient for it in the same backward (a parameter shared by two activation-
  // checkpointed segments: each recomputation runs a backward of its own) may come after its
  // bucket went out, and would be lost or counted as another parameter's: refused, as DeepSpeed
  // refuses it ("Gradient computed twice for this partition").
  template <class Launch>
  void mark_ready(size_t param, Launch&& launch) {
    refuse_second(param);
    marked_[param] = true;
    ++ready_[bucket_of_[param]];
    while (next_ < size_.size() && ready_[next_] == size_[next_]) launch(next_++);
  }
  // Parameter i gets no gradient in this backward (its graph cannot reach it: backward_reach.h):
  // ready now, its part of the bucket zeros, so that its bucket, and every later one, need not
  // wait for the end of backward. Called at the start of backward, before any gradient.
  template <class Launch>
  void mark_unreachable(size_t param, Launch&& launch) {
    mark_ready(param, launch);
    unreachable_[param] = true;
  }
  // What mark_ready refuses, checked alone: a caller that must copy the gradient somewhere
  // before marking it (into a bucket that mark_ready may launch) checks first.
  // `remedy`: what the user can do at the caller's stage.
  static constexpr const char* kOverlapRemedy =
      "set zero_optimization.overlap_comm to false at stage 0 or 1, or keep a shared parameter "
      "inside one checkpointed segment";
  void refuse_second(size_t param, const char* remedy = kOverlapRemedy) const {
    if (unreachable_[param])
      throw Error("parameter #" + std::to_string(param) +
                  " of the ZeRO stage got a gradient that the loss's autograd graph could not "
                  "give it when backward began (a hook, or an autograd function, ran a backward "
                  "of its own), after its gradient bucket may already have been reduced without "
                  "it. Run that backward outside engine.backward(), or make the parameter part "
                  "of the loss's graph");
    if (marked_[param])
      throw Error("parameter #" + std::to_string(param) +
                  " of the ZeRO stage got its gradient twice in one backward (a parameter "
                  "shared by two activation-checkpointed segments: each recomputation runs its "
                  "own backward), after its gradient bucket may already have been reduced. "
                  "DeepSpeed refuses this too; " + remedy);
  }
  // Whether parameter i's gradient arrived in this backward.
  bool marked(size_t param) const { return marked_[param]; }
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
  std::vector<bool> marked_;  // this backward's parameters whose gradient arrived
  std::vector<bool> unreachable_;  // of them, those marked unreachable before any gradient
  size_t next_ = 0;
};

}  // namespace zero
}  // namespace deepspeed
