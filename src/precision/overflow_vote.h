// Whether a training step votes across ranks on inf/NaN gradients and skips the step when any
// rank has one: fp16 always (its dynamic loss scale needs to know), bf16 only with
// bf16.check_grad_overflow, as DeepSpeed's check_grad_overflow (ZeRO stage_1_and_2.py, stage3.py,
// the bf16 optimizer). Everything that must know the overflow before the update (the engine's
// step, ZeRO-Offload's update during backward) asks here, so the choice is made in one place.
#pragma once

#include "deepspeed/config.h"

namespace deepspeed::precision {

inline bool votes_on_overflow(const Config& config) {
  return config.fp16.enabled || (config.bf16.enabled && config.bf16.check_grad_overflow);
}

}  // namespace deepspeed::precision
