// A marker for optimizers whose per-parameter state is torch::optim::AdamWParamState (step,
// exp_avg, exp_avg_sq), one entry per parameter tensor, all stepping in lockstep. Checkpoints
// save, load and reshard that state per element (zero/moment_state.h), whichever of
// these optimizers keeps it: FusedAdam, Lamb (the same two moments) and OneBitAdam (its frozen
// variance is exp_avg_sq).
#pragma once

namespace deepspeed {
namespace optim {

class AdamMoments {
 public:
  virtual ~AdamMoments() = default;
};

}  // namespace optim
}  // namespace deepspeed
