#include "zero/swapped_optimizer.h"

#include <torch/torch.h>

#include "deepspeed/errors.h"
#include "optim/fused_adam.h"

namespace deepspeed {
namespace zero {

std::unique_ptr<SwappedOptimizer> make_swapped_optimizer(
    const Config& config, const OptimizerFactory& make_optimizer, int64_t numel,
    const offload::GroupSource& initial_master, std::vector<std::pair<int64_t, int64_t>> groups) {
  auto out = std::make_unique<SwappedOptimizer>();
  out->options = make_optimizer({torch::zeros({0})});
  if (!dynamic_cast<optim::FusedAdam*>(out->options.get()))
    throw ConfigError("zero_optimization.offload_optimizer.device = \"nvme\" needs the \"Adam\" or "
                      "\"AdamW\" optimizer (the swapped update is the vectorised Adam)");
  const auto& off = config.zero_optimization.offload_optimizer;
  offload::SwapOptions o;
  o.dir = off.nvme_path;
  o.sub_group_size = config.zero_optimization.sub_group_size;
  o.buffer_count = static_cast<int>(off.buffer_count);
  o.aio.block_size = config.aio.block_size;
  o.aio.queue_depth = static_cast<int>(config.aio.queue_depth);
  o.groups = std::move(groups);
  out->adam = std::make_unique<offload::SwappedAdam>(numel, initial_master, o);
  return out;
}

namespace {
optim::AdamStepParams step_params(torch::optim::Optimizer& options, int64_t step, double grad_scale) {
  auto& fused = static_cast<optim::FusedAdam&>(options);
  auto& g = static_cast<torch::optim::AdamWOptions&>(options.param_groups().at(0).options());
  optim::AdamStepParams hp;
  hp.lr = static_cast<float>(g.lr());
  hp.beta1 = static_cast<float>(std::get<0>(g.betas()));
  hp.beta2 = static_cast<float>(std::get<1>(g.betas()));
  hp.eps = static_cast<float>(g.eps());
  hp.weight_decay = static_cast<float>(g.weight_decay());
  hp.adamw_mode = fused.adamw_mode();
  hp.bias_correction = fused.bias_correction();
  hp.step = step;
  hp.grad_scale = static_cast<float>(grad_scale);
  return hp;
}
}  // namespace

void SwappedOptimizer::step(const at::Tensor& grad, offload::ParamSink& out,
                            at::ScalarType out_dtype, double grad_scale) {
  adam->step(grad, out, out_dtype, step_params(*options, ++steps, grad_scale));
}

void SwappedOptimizer::step(offload::GradSource& grads, offload::ParamSink& out,
                            at::ScalarType out_dtype, double grad_scale) {
  adam->step(grads, out, out_dtype, step_params(*options, ++steps, grad_scale));
}

void SwappedOptimizer::step(const at::Tensor& grad, at::Tensor param_out, double grad_scale) {
  adam->step(grad, std::move(param_out), step_params(*options, ++steps, grad_scale));
}

}  // namespace zero
}  // namespace deepspeed
