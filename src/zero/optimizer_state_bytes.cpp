#include "zero/optimizer_state_bytes.h"

#include <set>

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
  // Each storage once: states may be slices of one buffer (Lion's or Adagrad's over parameter
  // groups' views of a partition, zero/view_moments.h).
  std::set<const void*> counted;
  int64_t total = 0;
  auto add = [&](const at::Tensor& t) {
    if (t.defined() && counted.insert(t.storage().unsafeGetStorageImpl()).second)
      total += storage_bytes(t);
  };
  for (auto& kv : optimizer.state()) {
    auto* s = kv.second.get();
    if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(s)) {
      add(a->exp_avg());
      add(a->exp_avg_sq());
      add(a->max_exp_avg_sq());
    } else if (auto* w = dynamic_cast<torch::optim::AdamWParamState*>(s)) {
      add(w->exp_avg());
      add(w->exp_avg_sq());
      add(w->max_exp_avg_sq());
    } else if (auto* g = dynamic_cast<torch::optim::SGDParamState*>(s)) {
      add(g->momentum_buffer());
    } else if (auto* ag = dynamic_cast<torch::optim::AdagradParamState*>(s)) {
      add(ag->sum());  // one fp32 per element (client and config Adagrad)
    } else if (auto* l = dynamic_cast<optim::LionParamState*>(s)) {
      add(l->exp_avg());  // one fp32 per element
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
