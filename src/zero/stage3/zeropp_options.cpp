#include "zero/stage3/zeropp_options.h"

#include <algorithm>
#include <string>

#include "deepspeed/errors.h"

namespace deepspeed {
namespace zero {

ZeroPPOptions resolve_zeropp(const ZeroConfig& zero, int world_size) {
  ZeroPPOptions o;
  o.quantized_weights = zero.zero_quantized_weights;
  o.quantized_gradients = zero.zero_quantized_gradients;
  const int64_t hpz = std::min<int64_t>(zero.zero_hpz_partition_size, world_size);
  if (hpz < 1 || world_size % hpz != 0)
    throw ConfigError("config key 'zero_optimization.zero_hpz_partition_size' is " +
                      std::to_string(zero.zero_hpz_partition_size) +
                      ", which does not divide the data-parallel world size " +
                      std::to_string(world_size) +
                      " (hpZ groups are that many consecutive ranks)");
  o.hpz = static_cast<int>(hpz);
  return o;
}

comm::CommunicatorPtr make_hpz_group(comm::Communicator& comm, int hpz) {
  if (hpz <= 1) return nullptr;
  return comm.split(/*color=*/comm.rank() / hpz, /*key=*/comm.rank());
}

}  // namespace zero
}  // namespace deepspeed
