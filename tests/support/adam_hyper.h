// The Adam hyper-parameters the optimizer unit tests step with (one place, not a copy in each).
#pragma once
#include "deepspeed/optimizer.h"

namespace dstest {

// AdamW with a learning rate and weight decay large enough that every term of the update shows
// in a few steps (the rest DeepSpeed's FusedAdam defaults).
inline deepspeed::AdamHyper decaying_adam_hyper() {
  deepspeed::AdamHyper h;
  h.lr = 1e-2;
  h.weight_decay = 0.1;
  return h;
}

}  // namespace dstest
