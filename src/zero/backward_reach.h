// Which parameters a backward can give a gradient: the leaves its autograd graph reaches, found
// before it runs by walking the graph from the loss (PyTorch DDP's find_unused_parameters). A
// parameter the graph cannot reach gets no gradient in that backward, so the gradient buckets
// need not wait for it (bucket_order.h): without this, one unused parameter in an early bucket
// held back every later bucket to the end of backward (at stages 2 and 3 each holding a buffer).
//
// Conservative: a node whose backward may run a backward of its own (activation checkpointing's
// recomputation, which builds the segment's graph, and so its parameters' edges, only then; any
// custom autograd function not deepspeed's own, whose backward is the user's code) makes the
// whole walk unknown, and nothing is ruled out: the buckets wait as they did.
#pragma once
#include <unordered_set>

#include <ATen/Tensor.h>

namespace torch {
namespace autograd {
struct Node;
}
}  // namespace torch

namespace deepspeed {
namespace zero {

class BackwardReach {
 public:
  // Walks the graph that backward() on `root` would run. `root` without a graph (it needs no
  // gradient: the backward will throw) is unknown.
  explicit BackwardReach(const at::Tensor& root);
  // Whether reaches() can rule a parameter out.
  bool known() const { return known_; }
  // Whether the backward can give `param` (a leaf) a gradient. True when !known().
  bool reaches(const at::Tensor& param) const;

 private:
  bool known_ = false;
  std::unordered_set<const torch::autograd::Node*> nodes_;
};

}  // namespace zero
}  // namespace deepspeed
