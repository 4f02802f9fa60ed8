#include "zero/optimizer_state_bytes.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

namespace deepspeed {
namespace zero {
namespace {
int64_t bytes(const at::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.storage().nbytes()) : 0;
}
}  // namespace

int64_t optimizer_state_bytes(torch::optim::Optimizer& optimizer) {
  int64_t total = 0;
  for (auto& kv : optimizer.state()) {
    auto* s = kv.second.get();
    if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(s)) {
      total += bytes(a->exp_avg()) + bytes(a->exp_avg_sq()) + bytes(a->max_exp_avg_sq());
    } else if (auto* w = dynamic_cast<torch::optim::AdamWParamState*>(s)) {
      total += bytes(w->exp_avg()) + bytes(w->exp_avg_sq()) + bytes(w->max_exp_avg_sq());
    } else if (auto* g = dynamic_cast<torch::optim::SGDParamState*>(s)) {
      total += bytes(g->momentum_buffer());
    }
  }
  return total;
}

}  // namespace zero
}  // namespace deepspeed
