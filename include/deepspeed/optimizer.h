// Optimizers from DeepSpeed's `"optimizer"` block: {"type": ..., "params": {...}}.
//
// Types (case-insensitive): Adam, AdamW, SGD, Adagrad, Lamb, and (through initialize() only: their
// compressed exchange is a collective of the engine's group) OneBitAdam, ZeroOneAdam and
// OneBitLamb; their
// parameters are in docs/config.md. As in DeepSpeed, "Adam" uses decoupled
// weight decay (AdamW) unless params.adam_w_mode is false, and "AdamW" is always decoupled.
// Defaults are DeepSpeed FusedAdam's: lr 1e-3, betas [0.9, 0.999], eps 1e-8, weight_decay 0
// (not libtorch AdamW's 1e-2; the config's "torch_adam": true takes torch's 1e-2, as DeepSpeed).
//
// Parameters are checked strictly, as DeepSpeed's optimizer constructors do: an unknown key is a
// ConfigError naming optimizer.params.<key>; so is "max_grad_norm" (use the top-level
// "gradient_clipping"), "amsgrad": true and, for make_optimizer, "bias_correction": false.
#pragma once
#include <ATen/Tensor.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <vector>

#include "deepspeed/config.h"

namespace deepspeed {

// Adam hyper-parameters, for code that runs its own Adam on flat buffers (ZeRO partitions, CPU
// offload) with exactly the settings make_optimizer would use.
struct AdamHyper {
  double lr = 1e-3;             // params.lr
  double beta1 = 0.9;           // params.betas[0]
  double beta2 = 0.999;         // params.betas[1]
  double eps = 1e-8;            // params.eps
  double weight_decay = 0.0;    // params.weight_decay
  bool adamw_mode = true;       // decoupled decay; false only for type Adam + adam_w_mode false
  bool bias_correction = true;  // params.bias_correction
};

// Reads an Adam or AdamW block. Throws ConfigError for another type or a bad parameter.
AdamHyper parse_adam_params(const OptimizerConfig& config);

// The canonical spelling of a supported type ("adamw" -> "AdamW"). Throws ConfigError listing the
// supported types when `type` is not one.
std::string canonical_optimizer_type(const std::string& type);
std::vector<std::string> supported_optimizers();

// A libtorch optimizer over `params` (one parameter group) with the block's hyper-parameters:
// torch::optim::AdamW (decoupled), torch::optim::Adam (L2, adam_w_mode false), SGD or Adagrad.
std::shared_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& config,
                                                        std::vector<at::Tensor> params);
// Several groups: a group without options gets the block's; one with options keeps its own.
std::shared_ptr<torch::optim::Optimizer> make_optimizer(
    const OptimizerConfig& config, std::vector<torch::optim::OptimizerParamGroup> groups);

// DeepSpeed's exp_avg_mask (a param-group entry there) for the 1-bit optimizers: 1-bit compression
// cannot represent an exact zero, so where a parameter's gradient is always zero in part (an
// attention key bias; embedding rows never used) the compressed exchange invents momentum that a
// near-zero variance turns into unbounded steps. `mask` (the parameter's shape; 1 keep, 0 zero) is
// multiplied into the momentum after each compressed exchange. `optimizer` is the engine's
// (engine->optimizer()). Throws ConfigError when it is not a 1-bit optimizer, `param` is not
// one of its parameters, or the shapes differ.
void set_exp_avg_mask(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                      const at::Tensor& mask);

}  // namespace deepspeed
