#include "zero/backward_reach.h"

#include <string>
#include <typeindex>
#include <unordered_map>
#include <vector>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

namespace deepspeed {
namespace zero {

namespace {

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// A custom autograd function's node (torch::autograd::Function<T> makes a CppNode<T>, named after
// T) whose backward may run a backward of its own. deepspeed's own functions compute their
// gradients directly (ZeRO-3's gather and linear, tensor parallelism's mappings), except the
// activation checkpoint's (deepspeed::checkpointing), which recomputes its segment and runs
// backward through it. Another library's or the user's function could do anything.
bool may_run_own_backward(const torch::autograd::Node& node) {
  const std::string name = node.name();  // the demangled type, unless the node renames itself
  if (!starts_with(name, "torch::autograd::CppNode<")) return false;
  return !starts_with(name, "torch::autograd::CppNode<deepspeed::") ||
         starts_with(name, "torch::autograd::CppNode<deepspeed::checkpointing::");
}

}  // namespace

BackwardReach::BackwardReach(const at::Tensor& root) {
  if (!root.defined() || !root.requires_grad()) return;
  const auto start = torch::autograd::impl::gradient_edge(root).function;
  if (!start) return;
  // Asked once per node type (the name is demangled), not once per node.
  std::unordered_map<std::type_index, bool> opaque;
  std::vector<const torch::autograd::Node*> stack{start.get()};
  nodes_.insert(start.get());
  while (!stack.empty()) {
    const torch::autograd::Node* node = stack.back();
    stack.pop_back();
    auto [it, fresh] = opaque.try_emplace(std::type_index(typeid(*node)), false);
    if (fresh) it->second = may_run_own_backward(*node);
    if (it->second) {
      nodes_.clear();
      return;  // unknown
    }
    for (const auto& edge : node->next_edges())
      if (edge.function && nodes_.insert(edge.function.get()).second)
        stack.push_back(edge.function.get());
  }
  known_ = true;
}

bool BackwardReach::reaches(const at::Tensor& param) const {
  if (!known_) return true;
  // The node autograd accumulates the parameter's gradient in (and the gradient hooks sit on);
  // none yet: no graph has used the parameter.
  const auto accumulator = torch::autograd::impl::try_get_grad_accumulator(param);
  return accumulator && nodes_.count(accumulator.get()) > 0;
}

}  // namespace zero
}  // namespace deepspeed
