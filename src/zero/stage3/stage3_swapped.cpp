// ZeRO-Infinity's optimizer offload for stage 3: offload_optimizer.device = "nvme" keeps each
// rank's fp32 master partition and Adam moments in a file under nvme_path (offload/swapped_adam.h)
// and streams them through a few sub-group buffers at every step. Only Adam/AdamW can be swapped.
#include <torch/torch.h>

#include "deepspeed/errors.h"
#include "optim/fused_adam.h"
#include "zero/stage3/stage3.h"

namespace deepspeed {
namespace zero {

void Stage3::make_swapped_optimizer(const OptimizerFactory& make_optimizer) {
  const auto& off = config_.zero_optimization.offload_optimizer;
  // The optimizer object holds no state: it carries lr/betas/eps/weight decay for the scheduler.
  master_ = torch::zeros({0});
  optimizer_ = make_optimizer({master_});
  if (!dynamic_cast<optim::FusedAdam*>(optimizer_.get()))
    throw ConfigError("zero_optimization.offload_optimizer.device = \"nvme\" needs the \"Adam\" or "
                      "\"AdamW\" optimizer (the swapped update is the vectorised Adam)");
  offload::SwapOptions o;
  o.dir = off.nvme_path;
  o.sub_group_size = config_.zero_optimization.sub_group_size;
  o.buffer_count = static_cast<int>(off.buffer_count);
  o.aio.block_size = config_.aio.block_size;
  o.aio.queue_depth = static_cast<int>(config_.aio.queue_depth);
  if (params_->swapped()) o.groups = params_->swap_groups(o.sub_group_size);
  swapped_ = std::make_unique<offload::SwappedAdam>(
      layout_.partition_numel,
      [this](int64_t begin, int64_t n) { return params_->read_group(begin, n); }, o);
}

void Stage3::swapped_step(double grad_scale) {
  auto& fused = static_cast<optim::FusedAdam&>(*optimizer_);
  auto& g = static_cast<torch::optim::AdamWOptions&>(optimizer_->param_groups().at(0).options());
  optim::AdamStepParams hp;
  hp.lr = static_cast<float>(g.lr());
  hp.beta1 = static_cast<float>(std::get<0>(g.betas()));
  hp.beta2 = static_cast<float>(std::get<1>(g.betas()));
  hp.eps = static_cast<float>(g.eps());
  hp.weight_decay = static_cast<float>(g.weight_decay());
  hp.adamw_mode = fused.adamw_mode();
  hp.bias_correction = fused.bias_correction();
  hp.step = ++swapped_steps_;
  hp.grad_scale = static_cast<float>(grad_scale);
  swapped_->step(grad_partition_, *params_, param_dtype_, hp);
}

}  // namespace zero
}  // namespace deepspeed
