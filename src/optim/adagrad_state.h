// libtorch's Adagrad creates each parameter's state (a zero step count and its sum, filled with
// the optimizer's default initial_accumulator_value, whatever the parameter's group says) in its
// constructor only, and asserts in step() that it exists ("state found NULL for the Tensor").
// Tensors it gets later have none: a parameter group added after construction
// (InitializeArgs.model_parameters), or what a ZeRO stage gives a client Adagrad in place of the
// module's parameters (the fp32 partition, or its views per group: zero/client_optimizer.h,
// zero/flat_groups.h), whose state is cleared. Both ways below make it at the step.
#pragma once
#include <torch/optim/adagrad.h>

namespace deepspeed {
namespace optim {

// The config's "Adagrad" (optimizer_factory.cpp): a missing state is made at its step from the
// parameter's group's initial_accumulator_value, as torch.optim.Adagrad makes it (DeepSpeed's
// groups, InitializeArgs.model_parameters, each keep their own).
class LazyStateAdagrad : public torch::optim::Adagrad {
 public:
  using torch::optim::Adagrad::Adagrad;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

// A client's torch::optim::Adagrad stepped by a ZeRO shard: every parameter without state gets
// the state libtorch's constructor made for the module's parameters (from the optimizer's
// default initial_accumulator_value), so the partition steps as the client would have stepped
// them. Nothing for any other optimizer or for a LazyStateAdagrad (which makes its own). Call it
// before each step: the shard may replace the tensors (views, a load) between steps.
void add_missing_client_adagrad_state(torch::optim::Optimizer& optimizer);

// `param`'s state, made when it has none as the step would make it (a LazyStateAdagrad: from
// param's group's initial_accumulator_value; any other Adagrad: from the default's); nullptr
// when `param` is not one of its parameters. For checkpoints (zero/moment_state.h).
torch::optim::AdagradParamState* adagrad_state_of(torch::optim::Adagrad& adagrad,
                                                  const at::Tensor& param);

}  // namespace optim
}  // namespace deepspeed
