#include "zero/optimizer_state_bytes.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

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
    }
  }
  return total;
}

}  // namespace zero
}  // namespace deepspeed
