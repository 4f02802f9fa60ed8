// zero_optimization.ignore_unused_parameters false: an optimizer step in which some trainable
// parameter got no gradient from any of its backward passes fails, naming the parameters, on every
// data-parallel rank at once (DeepSpeed asserts, on the rank that saw it, in its stage 1-2
// CPU-offload norm; the other ranks would wait in the step's collectives). With the default, true,
// such a parameter steps with a zero gradient (zero/data_parallel.cpp).
// Thread-safety: the hooks run on the backward's threads; check_step on the caller's, after the
// backward passes returned.
#pragma once
#include <string>
#include <vector>

#include <ATen/Tensor.h>

#include "deepspeed/comm.h"
#include "zero/gradient_hooks.h"

namespace deepspeed {

class UnusedParameterCheck {
 public:
  // `trainable`: leaves with requires_grad, each once; `names[k]` names trainable[k].
  UnusedParameterCheck(const std::vector<at::Tensor>& trainable, std::vector<std::string> names);
  // At an optimizer step (COLLECTIVE over `comm`, the data-parallel group: one all-reduce of a
  // flag per parameter on `device`; and over `job` when it is larger, the pipeline stages and
  // tensor ranks: one of a count): throws ConfigError naming the parameters that got no gradient
  // since the last step on some rank of `comm`, or saying that another stage's did. After a step
  // that passes, the record starts again; after a throw it is kept (the same step called again
  // fails again).
  void check_step(comm::Communicator& comm, comm::Communicator& job, c10::Device device);

 private:
  zero::GradientHooks hooks_;
  std::vector<std::string> names_;
  std::vector<char> got_gradient_;  // per parameter, since the last step that passed
};

}  // namespace deepspeed
