#include "gpt/hf_adamw.h"

#include <set>
#include <string>
#include <vector>

namespace gpt {
namespace {

// Hugging Face's rule: a parameter whose name ends in "bias" is not decayed.
bool is_bias(const std::string& name) {
  const std::string tail = "bias";
  return name.size() >= tail.size() &&
         name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
}

// The parameters of every LayerNorm module (weight and bias), by identity.
std::set<const void*> layer_norm_parameters(torch::nn::Module& model) {
  std::set<const void*> out;
  auto add = [&out](torch::nn::Module& m) {
    if (m.as<torch::nn::LayerNorm>())
      for (auto& p : m.parameters(/*recurse=*/false)) out.insert(p.unsafeGetTensorImpl());
  };
  add(model);  // (modules(include_self) needs the model held in a shared_ptr)
  for (auto& m : model.modules(/*include_self=*/false)) add(*m);
  return out;
}

}  // namespace

std::shared_ptr<torch::optim::AdamW> hf_adamw(torch::nn::Module& model,
                                              const torch::optim::AdamWOptions& options,
                                              bool exempt_bias_and_norm) {
  const std::set<const void*> norms = layer_norm_parameters(model);
  std::vector<torch::Tensor> decay, no_decay;
  std::set<const void*> seen;
  for (auto& item : model.named_parameters()) {
    const torch::Tensor& p = item.value();
    if (!p.requires_grad() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
    const bool exempt = is_bias(item.key()) || norms.count(p.unsafeGetTensorImpl());
    (exempt_bias_and_norm && exempt ? no_decay : decay).push_back(p);
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decay.empty() || no_decay.empty())
    groups.emplace_back(std::move(decay), std::make_unique<torch::optim::AdamWOptions>(options));
  if (!no_decay.empty()) {
    auto zero = std::make_unique<torch::optim::AdamWOptions>(options);
    zero->weight_decay(0.0);
    groups.emplace_back(std::move(no_decay), std::move(zero));
  }
  return std::make_shared<torch::optim::AdamW>(std::move(groups), options);
}

}  // namespace gpt
