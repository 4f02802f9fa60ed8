// ZeRO++ (Wang et al. 2023) at stage 3: which of its three communication reductions are on, with
// the hpZ partition size resolved against the data-parallel world size. Read once when the stage
// is built; the gatherer and the gradient buckets see only this.
//
//   qwZ (zero_quantized_weights): unit all-gathers over the world move int8 blocks
//       (comm/quantize.h) and are dequantized on arrival (quantized_gather.h).
//   hpZ (zero_hpz_partition_size): a secondary partition inside groups of hpz consecutive ranks
//       (secondary_shard.h); a unit's backward gather is an all-gather inside the group.
//   qgZ (zero_quantized_gradients): gradient buckets are reduce-scattered as an all-to-all of
//       int8 blocks, summed in fp32; across nodes (LOCAL_WORLD_SIZE below the world size) in two
//       hops, int4 inside the node and int8 across (quantized_reduce.h).
#pragma once
#include "deepspeed/comm.h"
#include "deepspeed/config.h"

namespace deepspeed {
namespace zero {

struct ZeroPPOptions {
  bool quantized_weights = false;    // qwZ
  bool quantized_gradients = false;  // qgZ
  int hpz = 1;                       // hpZ group size; 1 = off
  bool any() const { return quantized_weights || quantized_gradients || hpz > 1; }
};

// DeepSpeed cuts zero_hpz_partition_size to the world size (min(hpz, world)) and requires the
// result to divide it; throws ConfigError naming zero_optimization.zero_hpz_partition_size,
// its value and the world size otherwise.
ZeroPPOptions resolve_zeropp(const ZeroConfig& zero, int world_size);

// The hpZ group of this rank: ranks [rank / hpz * hpz, + hpz) of `comm`, as a sub-communicator
// (nullptr when hpz is 1). COLLECTIVE over `comm` (one split).
comm::CommunicatorPtr make_hpz_group(comm::Communicator& comm, int hpz);

}  // namespace zero
}  // namespace deepspeed
