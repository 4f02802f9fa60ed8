// A client optimizer (InitializeArgs.optimizer) under ZeRO, as DeepSpeed takes one: the shard
// optimizer (zero/shard_optimizer.h) builds its optimizer over the rank's fp32 partition through
// an OptimizerFactory, and this makes that factory from the client's optimizer.
//
// - Shard home none/cpu without the CPU-Adam rule below: the client optimizer itself is used. Its
//   parameter groups keep their options (lr, betas, momentum, ...) and their parameters are
//   replaced by the fp32 partition the shard gives (one group: the partition; several: each
//   group the views of the partition over its parameters' elements); its state is cleared (it
//   has taken no step on the partition yet).
// - Optimizer offload (home cpu or nvme), DeepSpeed's zero_force_ds_cpu_optimizer: a client
//   torch::optim::Adam / AdamW (or FusedAdam) runs as the project's CPU Adam (FusedAdam; on nvme
//   the swapped Adam) with the client's lr, betas, eps and weight decay (Adam: L2 decay, AdamW:
//   decoupled). Any other client optimizer is refused naming zero_force_ds_cpu_optimizer, unless
//   that key is false and the home is cpu (then it steps the in-memory masters as above).
#pragma once
#include <ATen/Tensor.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

#include "deepspeed/config.h"
#include "zero/shard_optimizer.h"
#include "zero/stage_options.h"

namespace deepspeed {
namespace zero {

struct ClientOptimizerOptions {
  OffloadDevice home = OffloadDevice::kNone;  // offload_optimizer.device
  bool force_ds_cpu_optimizer = true;         // zero_force_ds_cpu_optimizer
};
ClientOptimizerOptions client_optimizer_options(const Config& config);

// REQUIRES: client is not null. Checks at once (ConfigError) that the client's parameter groups
// hold exactly the model's trainable parameters `trainable`, each once (the partition replaces
// all of them), and the offload rules above. Several groups (e.g. a weight-decay group and a
// no-decay one) keep their own options; the stage cuts its partition by group
// (zero/flat_groups.h, describe_client_groups); the CPU Adam of offload "cpu" and the swapped
// Adam of "nvme" get one group per client group. Refused with several groups: Lamb and the
// 1-bit optimizers as the client.
// A client with several parameter groups: records which group each trainable parameter is in
// (shard.group_of, group_count) for the stage to cut its partition by. Nothing for one group
// or no client.
void describe_client_groups(torch::optim::Optimizer* client,
                            const std::vector<at::Tensor>& trainable, ShardOptions& shard);

OptimizerFactory client_optimizer_factory(std::shared_ptr<torch::optim::Optimizer> client,
                                          const std::vector<at::Tensor>& trainable,
                                          const ClientOptimizerOptions& options);

}  // namespace zero
}  // namespace deepspeed
