// HF's two parameter groups of the example GPT, as the param-group tests build them: the
// matrices (dim >= 2) in a weight-decay group, the vectors (biases, LayerNorm weights) in a
// no-decay group, here as client optimizers (tests/dist/param_groups_test.cpp,
// model_parameters_test.cpp, tests/gpu/gpu_training_test.cpp), and how far each group moved.
#pragma once
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "gpt/model.h"
#include "support/training_run.h"

namespace dstest {

// `m`'s parameters split as HF's grouping does, each list in model order.
struct MatricesAndVectors {
  std::vector<torch::Tensor> matrices;  // dim >= 2: weight-decay group
  std::vector<torch::Tensor> vectors;   // biases, LayerNorm weights: no-decay group
};
MatricesAndVectors matrices_and_vectors(gpt::GPTImpl& m);

// libtorch AdamW options per group: the matrices at lr 3e-3 with weight_decay 0.1, the vectors
// at `vector_lr` (0 freezes them) with weight_decay 0.
std::vector<torch::optim::OptimizerParamGroup> two_adamw_groups(gpt::GPTImpl& m, double vector_lr);

// libtorch's AdamW over two_adamw_groups (its defaults: lr 3e-3).
std::shared_ptr<torch::optim::Optimizer> two_group_adamw(gpt::GPTImpl& m, double vector_lr);

// The project's FusedAdam with the same two groups (what the config's "AdamW" block builds).
std::shared_ptr<torch::optim::Optimizer> two_group_fused_adam(gpt::GPTImpl& m, double vector_lr);

// How far rank 0's matrices and vectors moved over a run: each the largest |change| of an
// element, from the initial values rounded to the weights' dtype (a bf16 model starts from
// their rounding).
struct Moved {
  double matrices = 0.0, vectors = 0.0;
};
Moved moved_by_group(const RunResult& r);

}  // namespace dstest
