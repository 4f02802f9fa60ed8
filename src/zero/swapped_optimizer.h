// offload_optimizer.device = "nvme" at any ZeRO stage (1-3): the rank's fp32 masters and Adam
// moments live in a SwappedAdam file under nvme_path; the optimizer object the engine and the LR
// scheduler see is a FusedAdam over a 0-element placeholder that only carries lr/betas/eps/weight
// decay. Only Adam/AdamW can be swapped (the swapped update is the vectorised Adam).
#pragma once
#include <memory>
#include <utility>
#include <vector>

#include <torch/optim/optimizer.h>

#include "deepspeed/config.h"
#include "offload/swapped_adam.h"
#include "zero/partitioned_stage.h"  // OptimizerFactory

namespace deepspeed {
namespace zero {

struct SwappedOptimizer {
  std::shared_ptr<torch::optim::Optimizer> options;  // param-group options, no state
  std::unique_ptr<offload::SwappedAdam> adam;
  int64_t steps = 0;  // Adam's step count (bias correction); checkpoints save it

  // One update of the whole partition: hyperparameters from `options`' param group.
  void step(const at::Tensor& grad, offload::ParamSink& out, at::ScalarType out_dtype, double grad_scale);
  void step(const at::Tensor& grad, at::Tensor param_out, double grad_scale);
  void step(offload::GradSource& grads, offload::ParamSink& out, at::ScalarType out_dtype,
            double grad_scale);
};

// Throws ConfigError for optimizers other than Adam/AdamW, IOError for a bad nvme_path.
// `initial_master(begin, n)` gives the partition's initial values one sub-group at a time;
// `groups` overrides the sub_group_size cuts (see SwapOptions::groups).
std::unique_ptr<SwappedOptimizer> make_swapped_optimizer(
    const Config& config, const OptimizerFactory& make_optimizer, int64_t numel,
    const offload::GroupSource& initial_master,
    std::vector<std::pair<int64_t, int64_t>> groups = {});

}  // namespace zero
}  // namespace deepspeed
