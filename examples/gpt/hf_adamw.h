// The Hugging Face Trainer's AdamW (Trainer.create_optimizer) over a libtorch module: two
// parameter groups, weight decay on the weights and none on the biases and LayerNorm parameters.
// In the gpt_example library so that tests reach it (gpt_train's make_adamw builds on it).
#pragma once
#include <memory>

#include <torch/torch.h>

namespace gpt {

// `options` (lr, betas, eps, weight_decay) for every parameter, except — with
// exempt_bias_and_norm — a second group with weight_decay 0 holding the parameters of LayerNorm
// modules and every parameter whose name ends in "bias" (HF's get_decay_parameter_names). The
// decayed group comes first; a group that would be empty is left out. Each trainable
// parameter appears once (a tied weight is one parameter). Without exempt_bias_and_norm: one
// group, weight decay on every parameter (torch's AdamW over model.parameters()). The engine
// takes both groups wherever it takes an AdamW (every stage, precision and optimizer offload:
// zero/client_optimizer.h); gpt_train always exempts.
std::shared_ptr<torch::optim::AdamW> hf_adamw(torch::nn::Module& model,
                                              const torch::optim::AdamWOptions& options,
                                              bool exempt_bias_and_norm);

}  // namespace gpt
