// What a driver of a ZeRO stage (the engine's backward, the pipeline's boundary backward) does
// when the backward it started threw: the stage gives back what it held for that pass at once
// (ZeroStage::abandon_backward), so a retry has that memory. A failure of that clean-up (a
// collective the failed pass launched) is left to the next begin_backward, which detects the
// failed pass again: the caller rethrows the first error, which is the one the user should see.
#pragma once
#include "zero/stage.h"

namespace deepspeed {
namespace zero {

inline void abandon_backward_quietly(ZeroStage& stage) noexcept {
  try {
    stage.abandon_backward();
  } catch (...) {
  }
}

}  // namespace zero
}  // namespace deepspeed
