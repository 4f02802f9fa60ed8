#include "support/param_groups.h"

#include <algorithm>

#include "optim/fused_adam.h"

namespace dstest {

MatricesAndVectors matrices_and_vectors(gpt::GPTImpl& m) {
  MatricesAndVectors out;
  for (auto& p : m.parameters()) (p.dim() >= 2 ? out.matrices : out.vectors).push_back(p);
  return out;
}

namespace {
torch::optim::AdamWOptions matrix_options() {
  return torch::optim::AdamWOptions(3e-3).weight_decay(0.1);
}
torch::optim::AdamWOptions vector_options(double vector_lr) {
  return torch::optim::AdamWOptions(vector_lr).weight_decay(0.0);
}
}  // namespace

std::vector<torch::optim::OptimizerParamGroup> two_adamw_groups(gpt::GPTImpl& m, double vector_lr) {
  auto [matrices, vectors] = matrices_and_vectors(m);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(matrices, std::make_unique<torch::optim::AdamWOptions>(matrix_options()));
  groups.emplace_back(vectors,
                      std::make_unique<torch::optim::AdamWOptions>(vector_options(vector_lr)));
  return groups;
}

std::shared_ptr<torch::optim::Optimizer> two_group_adamw(gpt::GPTImpl& m, double vector_lr) {
  return std::make_shared<torch::optim::AdamW>(two_adamw_groups(m, vector_lr),
                                               torch::optim::AdamWOptions(3e-3));
}

std::shared_ptr<torch::optim::Optimizer> two_group_fused_adam(gpt::GPTImpl& m, double vector_lr) {
  auto [matrices, vectors] = matrices_and_vectors(m);
  deepspeed::AdamHyper h;
  h.lr = matrix_options().lr();
  h.weight_decay = matrix_options().weight_decay();
  auto adam = std::make_shared<deepspeed::optim::FusedAdam>(matrices, h);
  adam->add_param_group(torch::optim::OptimizerParamGroup(
      vectors, std::make_unique<torch::optim::AdamWOptions>(vector_options(vector_lr))));
  return adam;
}

Moved moved_by_group(const RunResult& r) {
  Moved moved;
  for (size_t i = 0; i < r.weights.size() && i < r.initial.size(); ++i) {
    const auto now = r.weights[i].cpu();
    const auto start = r.initial[i].cpu().to(now.scalar_type());
    double& slot = r.initial[i].dim() >= 2 ? moved.matrices : moved.vectors;
    slot = std::max(slot, (now - start).abs().max().item<double>());
  }
  return moved;
}

}  // namespace dstest
