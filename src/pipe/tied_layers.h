// Tied layers across stages (TiedLayerSpec: the embedding reused as the LM head): one
// communicator per key over the stages that hold it, the weights made equal at start, and the
// gradients summed before the step. Separate from the engine because it is the only state that
// spans non-neighbouring stages, and it is set up once while the rest of the pipeline is built.
#pragma once
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "deepspeed/comm.h"
#include "deepspeed/pipe.h"
#include "deepspeed/topology.h"
#include "pipe/stage_module.h"

namespace deepspeed {
namespace pipe {

struct TiedGroup {
  std::string key;
  comm::CommunicatorPtr comm;  // the holders of the key with this rank's data and tensor
                               // coordinates
  std::vector<at::Tensor> params;
};

struct TiedLayers {
  std::vector<TiedGroup> groups;  // the keys this stage holds, in key order
  // Whether any key spans stages: the same on every rank (a middle stage may hold none of them),
  // so a refusal that depends on it is taken by every rank alike.
  bool spans_stages = false;
  // Trainable tied parameters whose gradient norm a lower stage counts already (PipeStage
  // subtracts them).
  std::vector<at::Tensor> counted_twice;
};

// COLLECTIVE over topology.world(): one split per key spanning stages, in key order on every
// rank; then over each group this stage holds, a broadcast of the weights from the lowest holding
// stage.
// Throws ConfigError for a key held by one stage only (with stages > 1) or combined with ZeRO-2.
TiedLayers tie_layers(const PipelineModule& model, const Partition& partition,
                      const StageModuleImpl& module, const comm::Topology& topology,
                      int zero_stage);

// COLLECTIVE over each group: sums the tied parameters' gradients over the stages holding them
// (a missing gradient counts as zeros).
void reduce_tied_grads(std::vector<TiedGroup>& groups);

}  // namespace pipe
}  // namespace deepspeed
