// The seam between the 1-bit optimizers and ZeRO stage 0's gradient reduction.
//
// 1-bit Adam (after freeze_step) and 0/1 Adam exchange their own compressed momentum instead of
// the gradients. While gradients_stay_local() is true, the stage must leave each rank's
// gradients as its own backward produced them — no all-reduce, no averaging — and the optimizer
// averages across ranks itself (DeepSpeed: the optimizer sets engine.enable_backward_allreduce =
// False). zero/data_parallel.cpp asks before every boundary backward.
#pragma once

namespace deepspeed {
namespace optim {

class SelfCommunicatingOptimizer {
 public:
  virtual ~SelfCommunicatingOptimizer() = default;
  // Whether the coming step() wants local gradients. Identical on every rank. Local.
  virtual bool gradients_stay_local() const = 0;
};

}  // namespace optim
}  // namespace deepspeed
