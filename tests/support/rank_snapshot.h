// A rank's training state at one moment, for tests that check whether a step was applied (an
// overflow skipped it, or it went through): the module's parameters and, of the rank's partition,
// the fp32 masters and both AdamW moments, all cloned.
#pragma once
#include <vector>

#include <torch/torch.h>

#include "deepspeed/engine.h"

namespace dstest {

struct RankSnapshot {
  std::vector<torch::Tensor> weights;  // engine.module()'s parameters (16-bit under fp16/bf16)
  std::vector<torch::Tensor> masters;  // the optimizer's parameters: the fp32 masters
  std::vector<torch::Tensor> moments;  // exp_avg, exp_avg_sq of each master in turn
};
// REQUIRES: an optimizer that keeps AdamW's per-parameter state (Adam, AdamW), every master
// stepped at least once.
RankSnapshot snapshot(deepspeed::Engine& engine);

// Detached clones of `tensors`.
std::vector<torch::Tensor> clones(const std::vector<torch::Tensor>& tensors);

// Every element of every tensor finite.
bool all_finite(const std::vector<torch::Tensor>& tensors);

}  // namespace dstest
