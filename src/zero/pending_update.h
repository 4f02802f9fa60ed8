// What a step can leave running into the next forward, for zero/forward_waits.h to wait on part
// by part: ZeRO-Offload's CPU Adam (offload_optimizer.overlap_forward, the shard optimizer) or
// the all-gather of the updated partitions (zero_optimization.overlap_param_gather,
// zero/param_gather.h).
#pragma once
#include <cstdint>
#include <functional>

namespace deepspeed {
namespace zero {

// When a forward first reads elements [begin, end) (of a partition, or of the flat buffer): a
// sort key, lower = sooner (ForwardWaits::first_read).
using ReadOrder = std::function<int64_t(int64_t begin, int64_t end)>;

class PendingUpdate {
 public:
  virtual ~PendingUpdate() = default;
  // Elements [begin, end) (in the coordinates its owner gave ForwardWaits) hold the last step's
  // values, and on a GPU the compute stream waits for them: nothing to do when nothing is left
  // running. Local.
  virtual void settle(int64_t /*begin*/, int64_t /*end*/) {}
  // Every element does. A failed update throws. Local.
  virtual void complete_step() {}
};

}  // namespace zero
}  // namespace deepspeed
