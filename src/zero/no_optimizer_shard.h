// The shard of an engine built without an optimizer (no "optimizer" block, no client optimizer:
// an evaluation or reference model, DeepSpeed's optimizer None). Stage 3 keeps partitioning its
// parameters and gathering them for forward (DeepSpeed's parameter-only DeepSpeedZeRoOffload),
// but holds no fp32 masters, no moments and (make_unit_gradients) no gradient partition: the
// partition in its training dtype is the only copy of the weights. Checkpoints still carry them
// as the "fp32" fragments: saving reads the partition widened to fp32 (the partition itself when
// it is fp32 and in memory), loading writes a widened buffer that finish_load narrows back into
// the partition. The engine refuses backward() and step() before anything reaches here.
#pragma once
#include <memory>

#include "zero/shard_optimizer.h"

namespace deepspeed {
namespace zero {

// `params` outlives the shard.
std::unique_ptr<ShardOptimizer> make_no_optimizer_shard(ParamPartition& params);
// Whether `shard` is one of those (it takes no gradients).
bool is_no_optimizer_shard(const ShardOptimizer& shard);

}  // namespace zero
}  // namespace deepspeed
