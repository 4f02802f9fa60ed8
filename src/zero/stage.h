// The ZeRO stage strategy: everything that differs between stages 0-3 lives behind this interface,
// chosen once when the engine is built, so the engine's step reads as one recipe with no
// `if (stage == 2)` in it.
//
// Vocabulary (used the same way everywhere): a *bucket* is a run of gradients reduced by one
// collective; a *partition* is the slice of a flat buffer that one rank owns.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "deepspeed/engine.h"

namespace deepspeed {
namespace zero {

class ZeroStage {
 public:
  virtual ~ZeroStage() = default;
  // Around loss.backward(). `boundary`: this micro-step ends a gradient accumulation, so the
  // gradients must be reduced across ranks before step(). COLLECTIVE when boundary.
  virtual void begin_backward(bool boundary) = 0;
  virtual void end_backward(bool boundary) = 0;
  // L2 norm of the averaged gradients over the whole model, identical on every rank. COLLECTIVE.
  virtual double global_grad_norm() = 0;
  // Scales gradients by grad_scale (clipping), runs the optimizer, leaves every rank with the
  // updated parameters, and clears gradients. COLLECTIVE.
  virtual void step(double grad_scale) = 0;
  // Drops the gradients of this step without updating (an fp16 overflow). Local.
  virtual void discard_gradients() = 0;
  virtual MemoryReport memory() const = 0;
  virtual std::shared_ptr<torch::optim::Optimizer> optimizer() const = 0;
  // Engine::forward is about to run the model (stage 3 restarts its trace). Local.
  virtual void before_forward() {}
  // Makes the full parameters of `modules` (all when empty) present and writable until the
  // returned function runs; that function re-partitions them, keeping modifier_rank's values
  // (none: edits are dropped). Both COLLECTIVE. Stages 0-2 always hold the full parameters.
  virtual std::function<void()> gather_for_access(
      const std::vector<std::shared_ptr<torch::nn::Module>>& /*modules*/,
      std::optional<int> /*modifier_rank*/) {
    return [] {};
  }
};

}  // namespace zero
}  // namespace deepspeed
