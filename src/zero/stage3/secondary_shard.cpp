#include "zero/stage3/secondary_shard.h"

#include <torch/torch.h>

namespace deepspeed {
namespace zero {

SecondaryShards::SecondaryShards(comm::CommunicatorPtr group, size_t units)
    : group_(std::move(group)), shards_(units) {}

void SecondaryShards::keep(int unit, const at::Tensor& full) {
  drop(unit);
  const int hpz = group_->world_size();
  TORCH_CHECK(full.numel() % hpz == 0, "hpZ: unit ", unit, " of ", full.numel(),
              " elements does not split into ", hpz, " secondary slices");
  const int64_t n = full.numel() / hpz;
  shards_[unit] = full.narrow(0, group_->rank() * n, n).clone();
  bytes_ += n * full.element_size();
}

comm::WorkPtr SecondaryShards::gather(int unit, at::Tensor& full) {
  TORCH_CHECK(has(unit), "hpZ: unit ", unit, " has no secondary slice to gather");
  return group_->all_gather(full, shards_[unit]);
}

void SecondaryShards::drop(int unit) {
  if (!has(unit)) return;
  bytes_ -= shards_[unit].numel() * shards_[unit].element_size();
  shards_[unit] = at::Tensor();
}

void SecondaryShards::drop_all() {
  for (size_t u = 0; u < shards_.size(); ++u) drop(static_cast<int>(u));
}

}  // namespace zero
}  // namespace deepspeed
