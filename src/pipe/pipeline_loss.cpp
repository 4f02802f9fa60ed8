// The last stage's loss, its backward and the batch loss every rank returns (pipeline_loss.h).
#include "pipe/pipeline_loss.h"

#include <torch/torch.h>

namespace deepspeed {
namespace pipe {

at::Tensor micro_batch_loss(const LossFn& loss_fn, const at::Tensor& outputs,
                            const at::Tensor& labels) {
  at::Tensor loss = loss_fn(outputs, labels);
  TORCH_CHECK(loss.numel() == 1, "pipeline: loss_fn must return a scalar, got shape ",
              loss.sizes());
  return loss;
}

void backward_loss(EngineState& s, const at::Tensor& loss) {
  const int64_t gas = s.config.gradient_accumulation_steps;
  // As Engine::backward: the loss divided by the accumulation steps, times the fp16 loss scale
  // (1 otherwise); the batch loss is accumulated for step().
  at::Tensor scaled = divided_by_accumulation(loss, gas);
  at::Tensor detached = scaled.detach().to(torch::kDouble).reshape({});
  s.loss_since_boundary =
      s.loss_since_boundary.defined() ? s.loss_since_boundary + detached : detached;
  const double scale = s.loss_scaler->scale();
  (scale != 1.0 ? scaled.to(torch::kFloat) * scale : scaled).backward();
}

// The last stage's mean over its data-parallel group, sent to the other stages of the pipe.
double batch_loss(EngineState& s, comm::Communicator& pipe, int stages, bool last_stage,
                  bool train, at::Tensor eval_loss_sum) {
  const int64_t gas = s.config.gradient_accumulation_steps;
  s.settle_figures();
  double loss = s.last_loss;
  if (!train) {
    s.comm->all_reduce(eval_loss_sum)->wait();
    loss = eval_loss_sum.item<double>() / (gas * s.comm->world_size());
  }
  if (stages > 1) {
    at::Tensor t = torch::full({1}, last_stage ? loss : 0.0, torch::kDouble);
    pipe.broadcast(t, stages - 1)->wait();
    loss = t.item<double>();
  }
  return loss;
}

}  // namespace pipe
}  // namespace deepspeed
