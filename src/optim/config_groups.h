// InitializeArgs.model_parameters: the config's "optimizer" block over the user's parameter
// groups (DeepSpeed's list of {"params": [...], "weight_decay": 0.0} dicts). Each group's
// options are laid over the block's "params"; the stages step the groups as they step a client
// optimizer's (zero/flat_groups.h): stage 0 in fp32 the module's parameters group by group, the
// others the views (libtorch optimizers) or segments (FusedAdam) of their fp32 partition.
#pragma once
#include <ATen/Tensor.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "deepspeed/config.h"

namespace deepspeed {
struct ParamGroup;  // deepspeed/engine.h

namespace optim {

struct ConfigGroups {
  std::vector<OptimizerConfig> blocks;  // per group: the block, its "params" under the options
  std::vector<int> group_of;            // per trainable parameter: its group
  int count() const { return static_cast<int>(blocks.size()); }
};

// Checks InitializeArgs.model_parameters (`groups`, not empty) against the config, the client
// optimizer and the trainable parameters (`names` parallel to them, for messages), and gives each
// group its block. Throws ConfigError: with a client optimizer or no "optimizer" block; a tensor
// that is not a trainable parameter, a parameter in two groups or in none (naming the group or
// the parameter); a key the type does not keep per group, or a bad value (naming the group index,
// the key and the type); several groups for Lamb or the 1-bit types.
ConfigGroups resolve_model_parameters(const Config& config, bool client_optimizer,
                                      const std::vector<ParamGroup>& groups,
                                      const std::vector<at::Tensor>& trainable,
                                      const std::vector<std::string>& names);

// Builds an optimizer of a block's type over some tensors (the engine's config optimizer).
using BlockOptimizer = std::function<std::shared_ptr<torch::optim::Optimizer>(
    const OptimizerConfig&, std::vector<at::Tensor>)>;

// The optimizer of groups.count() parameter groups, group g holding per_group[g] with the
// options `build` gives blocks[g] (built over no tensors and cloned), so each group steps as a
// one-group optimizer of its block would. Settings of the whole optimizer (adam_w_mode,
// bias_correction) are the block's: groups cannot set them.
// REQUIRES: per_group.size() == groups.count().
std::shared_ptr<torch::optim::Optimizer> grouped_optimizer(
    const ConfigGroups& groups, std::vector<std::vector<at::Tensor>> per_group,
    const BlockOptimizer& build);

// `trainable` cut by group_of, in trainable order (stage 0 in fp32 steps the module's own).
std::vector<std::vector<at::Tensor>> split_by_group(const std::vector<at::Tensor>& trainable,
                                                    const ConfigGroups& groups);

}  // namespace optim
}  // namespace deepspeed
