// hpZ's secondary partition (ZeRO++): after a unit's forward gather over the whole data-parallel
// group, each rank keeps the part of the unit that its hpZ group's all-gather will need, so the
// unit's backward gather is an all-gather inside the group of hpz consecutive ranks (one node,
// when hpz is the ranks per node) instead of across the world.
//
// The unit's padded flat buffer (P elements, a multiple of world_size) is cut into hpz secondary
// slices of P / hpz elements; the rank with index i in its group keeps slice i. Memory: P / hpz
// per unit held, on top of the P / world_size primary slice, from the forward gather until the
// unit's backward (or the next forward). The secondary holds the gathered values (after qwZ's
// dequantization), so forward and backward see the same weights.
//
// Not thread-safe: used on the thread running forward/backward, like the UnitGatherer.
#pragma once
#include <vector>

#include <ATen/Tensor.h>

#include "deepspeed/comm.h"

namespace deepspeed {
namespace zero {

class SecondaryShards {
 public:
  // group: this rank's hpZ group (zeropp_options.h: make_hpz_group); units: how many units.
  SecondaryShards(comm::CommunicatorPtr group, size_t units);

  bool has(int unit) const { return shards_[unit].defined(); }
  // Keeps this rank's secondary slice of the gathered unit `full` (copied: `full` is freed next).
  void keep(int unit, const at::Tensor& full);
  // Starts the group all-gather of the unit's secondary slices into `full` (its padded size).
  // COLLECTIVE over the group. REQUIRES: has(unit).
  comm::WorkPtr gather(int unit, at::Tensor& full);
  void drop(int unit);
  void drop_all();
  int64_t bytes() const { return bytes_; }
  const comm::CommunicatorPtr& group() const { return group_; }

 private:
  comm::CommunicatorPtr group_;
  std::vector<at::Tensor> shards_;
  int64_t bytes_ = 0;
};

}  // namespace zero
}  // namespace deepspeed
