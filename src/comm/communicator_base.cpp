#include "comm/communicator_base.h"

#include <fmt/format.h>

#include "comm/dtypes.h"

namespace deepspeed {
namespace comm {

void CommunicatorBase::check_split(const char* op, const at::Tensor& big,
                                   const at::Tensor& small) const {
  if (big.numel() != world_size_ * small.numel()) {
    throw CommError(fmt::format(
        "{} on rank {} of {}: the full tensor has {} elements, expected world_size {} x {} = {}",
        op, rank_, world_size_, big.numel(), world_size_, small.numel(),
        world_size_ * small.numel()));
  }
  if (big.scalar_type() != small.scalar_type()) {
    throw CommError(fmt::format("{} on rank {} of {}: dtypes differ ({} vs {})", op, rank_,
                                world_size_, dtype_name(big.scalar_type()),
                                dtype_name(small.scalar_type())));
  }
}

void CommunicatorBase::check_peer(const char* op, int peer) const {
  if (peer < 0 || peer >= world_size_) {
    throw CommError(fmt::format("{} on rank {} of {}: peer rank {} is out of range [0, {})", op,
                                rank_, world_size_, peer, world_size_));
  }
}

}  // namespace comm
}  // namespace deepspeed
