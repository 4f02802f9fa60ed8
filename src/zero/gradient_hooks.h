// Gradient-ready hooks: a callback after autograd has accumulated a leaf parameter's gradient
// for this backward (post hook on its AccumulateGrad node, the mechanism c10d's DDP reducer uses).
// Fires once per backward per parameter even when the parameter is used several times.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <ATen/Tensor.h>

namespace torch {
namespace autograd {
struct Node;
}
}  // namespace torch

namespace deepspeed {
namespace zero {

class GradientHooks {
 public:
  GradientHooks() = default;
  GradientHooks(const GradientHooks&) = delete;
  GradientHooks& operator=(const GradientHooks&) = delete;
  ~GradientHooks();
  // REQUIRES: param is a leaf with requires_grad. `fn` runs on the thread running backward.
  void add(const at::Tensor& param, std::function<void()> fn);
  void clear();
  bool empty() const { return entries_.empty(); }

 private:
  struct Entry {
    std::shared_ptr<torch::autograd::Node> accumulator;  // kept alive: the param holds it weakly
    uintptr_t key;
  };
  std::vector<Entry> entries_;
};

}  // namespace zero
}  // namespace deepspeed
