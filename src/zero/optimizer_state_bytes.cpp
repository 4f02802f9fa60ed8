#include "zero/optimizer_state_bytes.h"

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "optim/extra_state.h"
#include "optim/lion.h"
#include "zero/tensor_facts.h"

namespace deepspeed {
namespace zero {
int64_t optimizer_state_bytes(torch::optim::Optimizer& optimizer) {
  int64_t total = 0;
  for (auto& kv : optimizer.state()) {
    auto* s = kv.second.get();
    if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(s)) {
      total += storage_bytes(a->exp_avg()) + storage_bytes(a->exp_avg_sq()) + storage_bytes(a->max_exp_avg_sq());
    } else if (auto* w = dynamic_cast<torch::optim::AdamWParamState*>(s)) {
      total += storage_bytes(w->exp_avg()) + storage_bytes(w->exp_avg_sq()) + storage_bytes(w->max_exp_avg_sq());
    } else if (auto* g = dynamic_cast<torch::optim::SGDParamState*>(s)) {
      total += storage_bytes(g->momentum_buffer());
    } else if (auto* ag = dynamic_cast<torch::optim::AdagradParamState*>(s)) {
      total += storage_bytes(ag->sum());  // one fp32 per element (client and config Adagrad)
    } else if (auto* l = dynamic_cast<optim::LionParamState*>(s)) {
      total += storage_bytes(l->exp_avg());  // one fp32 per element
    }
  }
  // The 1-bit family's buffers beside the moments (error feedback, fresh variance, local
  // updates): optimizer state too, saved with it in checkpoints (optim/extra_state.h).
  if (auto* extra = dynamic_cast<optim::ExtraOptimizerState*>(&optimizer))
    total += extra->extra_state_bytes();
  return total;
}

}  // namespace zero
}  // namespace deepspeed
