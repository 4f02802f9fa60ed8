// The loss of a pipelined batch: computed on the last stage only, backpropagated there as
// Engine::backward would, and reduced so that every rank of every stage returns the same batch
// loss. Separate from the schedule interpreter because this is where the numbers the user sees
// are defined (GAS scaling, fp16 loss scale, mean over data-parallel ranks), and they must match
// the non-pipelined Engine's.
#pragma once
#include <cstdint>

#include <ATen/core/Tensor.h>

#include "deepspeed/comm.h"
#include "deepspeed/pipe.h"
#include "runtime/engine_state.h"

namespace deepspeed {
namespace pipe {

// loss_fn(outputs, labels) of one micro-batch; throws unless it is a scalar.
at::Tensor micro_batch_loss(const LossFn& loss_fn, const at::Tensor& outputs,
                            const at::Tensor& labels);

// The last stage's backward of one micro-batch's loss, as Engine::backward: the loss divided by
// the accumulation steps, times the loss scale, and accumulated into s.loss_since_boundary for
// the step's logged loss.
void backward_loss(EngineState& s, const at::Tensor& loss);

// The batch loss on every rank: on the last stage s.last_loss (train: the step's mean over the
// data-parallel group) or, for eval, `eval_loss_sum` (a 1-element double tensor, the sum of this
// rank's micro-batch losses) averaged over micro-batches and the data-parallel group; then
// broadcast from the last stage over `pipe`. COLLECTIVE over the data-parallel group (eval) and
// the pipe group (stages > 1).
double batch_loss(EngineState& s, comm::Communicator& pipe, int stages, bool last_stage,
                  bool train, at::Tensor eval_loss_sum);

}  // namespace pipe
}  // namespace deepspeed
