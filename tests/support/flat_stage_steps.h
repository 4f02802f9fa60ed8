// Hand-driven training steps of a FlatStage, as the engine drives them (tests/unit that check a
// stage's overlaps against its plain run): before_forward, the forward's loss, backward between
// the stage's hooks, step.
#pragma once
#include <torch/torch.h>

#include <functional>

#include "zero/flat_stage.h"

namespace dstest {

// `steps` boundary steps; `loss_of(step)` runs the forward; `after_step(step, loss)` sees each
// step's loss once the stage stepped.
inline void run_flat_stage_steps(deepspeed::zero::FlatStage& stage, int steps,
                                 const std::function<at::Tensor(int)>& loss_of,
                                 const std::function<void(int, const at::Tensor&)>& after_step) {
  for (int step = 0; step < steps; ++step) {
    stage.before_forward();
    at::Tensor loss = loss_of(step);
    stage.begin_backward(true);
    loss.backward();
    stage.end_backward(true);
    stage.step(1.0);
    after_step(step, loss);
  }
}

}  // namespace dstest
