// The Adam-style keys of "optimizer.params" (lr, betas, eps, weight_decay; amsgrad refused), read
// and range-checked in one place for Adam/AdamW (optimizer_factory.cpp), Lamb and the 1-bit family
// (optimizer_params_1bit.cpp). H: a hyper-parameter struct with lr, beta1, beta2, eps,
// weight_decay (optimizer_params.h, fused_adam.h).
#pragma once
#include <limits>
#include <string>

#include "deepspeed/errors.h"
#include "optim/param_reader.h"

namespace deepspeed {
namespace optim {

// `type`: DeepSpeed's optimizer, for the amsgrad refusal ("FusedAdam", "Lamb", ...).
template <class H>
void read_adam_keys(ParamReader& r, H& h, const std::string& type) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  h.lr = r.get_double("lr", h.lr);
  auto betas = r.get_list("betas", {h.beta1, h.beta2}, 2);
  h.beta1 = betas[0];
  h.beta2 = betas[1];
  h.eps = r.get_double("eps", h.eps);
  h.weight_decay = r.get_double("weight_decay", h.weight_decay);
  if (r.get_bool("amsgrad", false))
    throw ConfigError(r.path("amsgrad") + " = true is not supported (DeepSpeed's " + type +
                      " has no AMSGrad variant either)");
  check_range(r, "lr", h.lr, 0, kInf);
  check_range(r, "betas[0]", h.beta1, 0, 1);
  check_range(r, "betas[1]", h.beta2, 0, 1);
  check_range(r, "eps", h.eps, 0, kInf);
  check_range(r, "weight_decay", h.weight_decay, 0, kInf);
}

}  // namespace optim
}  // namespace deepspeed
