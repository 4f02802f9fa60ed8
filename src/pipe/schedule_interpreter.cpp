// PipelineEngine::run: executes a Schedule's instructions in order on this stage — the
// micro-batch buffers, forward and backward passes, the gradient reduction boundary and the
// step — and times the batch. Separate from the rest of the engine because it is the one place
// that gives each Op its meaning; the transfers (stage_link.h), the loss (pipeline_loss.h) and
// the tied gradients (tied_layers.h) are delegated to their owners.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>

#include "device/out_of_memory.h"
#include "monitor/training_monitor.h"
#include "pipe/pipeline_loss.h"
#include "pipe/pipeline_runtime.h"
#include "runtime/engine_state.h"
#include "zero/abandon_backward.h"

namespace deepspeed {
namespace pipe {

namespace {
// One micro-batch in flight on this stage, from its load or receive to its last send.
struct Buffer {
  at::Tensor input, output, labels, grad_output, loss;
};

// A training batch that threw midway leaves nothing of itself in the gradients: a batch is
// retried whole (train_batch again), so what its finished micro-batches accumulated in .grad,
// and what a failed boundary backward reduced into the stage's partition, would otherwise count
// twice. In place, because stage 1's .grad are views of its flat buffer. The stage's own refusal
// stays: a boundary backward that already updated offloaded optimizer ranges (overlap_step) is
// reported at the next backward.
void forget_failed_batch(zero::ZeroStage& stage, StageModule& module, int& held) noexcept {
  held = 0;  // the failed batch's activations are gone with its buffers
  try {
    stage.discard_gradients();
  } catch (...) {
  }
  try {
    for (auto& p : module->parameters())
      if (p.grad().defined()) p.mutable_grad().zero_();
  } catch (...) {
  }
}
}  // namespace

double PipelineEngine::run(const Schedule& schedule, const DataIterator& data, bool train) try {
  auto& s = state_of(*this);
  auto& rt = *rt_;
  const int64_t gas = s.config.gradient_accumulation_steps;
  const bool first = rt.stage == 0, last = rt.stage == rt.stages - 1;
  // A batch is a whole accumulation: nothing of a batch that threw midway counts in this one's
  // mean loss.
  if (train) s.loss_since_boundary = at::Tensor();
  if (train) s.monitor->timers().begin_training();  // the throughput figures count from here
  forget_failed_allocation();  // an out-of-memory report names only this batch's
  const char* phase = train ? "train_batch" : "eval_batch";
  std::vector<Buffer> bufs(schedule.num_buffers);
  at::Tensor eval_loss = torch::zeros({1}, torch::kDouble);
  StageLink& link = *rt.link;
  using Clock = std::chrono::steady_clock;
  const auto batch_start = Clock::now();
  double compute_s = 0.0, step_s = 0.0;
  auto seconds_since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };

  try {  // the batch's instructions
    for (const auto& tick : schedule.steps) {
      for (const Instruction& in : tick) {
        switch (in.op) {
          case Op::LoadMicroBatch: {
            MicroBatch mb = data();
            if (first) bufs[in.buffer].input = mb.first.to(s.device);
            if (last) bufs[in.buffer].labels = mb.second.to(s.device);
            break;
          }
          case Op::RecvActivation: {
            at::Tensor t = link.recv_activation(s.device);
            if (train && t.is_floating_point()) t.requires_grad_(true);
            bufs[in.buffer].input = t;
            break;
          }
          case Op::ForwardPass: {
            const auto t0 = Clock::now();
            Buffer& b = bufs[in.buffer];
            at::Tensor out = rt.module->forward(b.input);
            if (last) {
              b.loss = micro_batch_loss(rt.spec.loss_fn, out, b.labels);
              if (!train) {
                eval_loss += b.loss.detach().to(torch::kDouble).cpu().reshape({1});
                b = Buffer();
              }
            } else {
              b.output = out;
            }
            if (train) rt.max_held = std::max(rt.max_held, ++rt.held);
            compute_s += seconds_since(t0);
            break;
          }
          case Op::SendActivation: {
            Buffer& b = bufs[in.buffer];
            link.send_activation(b.output);
            if (!train) b = Buffer();
            break;
          }
          case Op::RecvGrad: {
            Buffer& b = bufs[in.buffer];
            b.grad_output = link.recv_grad(b.output);
            break;
          }
          case Op::BackwardPass: {
            const auto t0 = Clock::now();
            Buffer& b = bufs[in.buffer];
            // Only the batch's last backward goes through the ZeRO stage: before it, autograd
            // accumulates into the parameters' .grad, and the boundary backward reduces the sum
            // once (ZeRO-2 included: one reduce-scatter per batch, not one per micro-batch, which
            // is what made DeepSpeed refuse ZeRO-2 with a pipeline). Stages 0-1 reduce only at the
            // boundary anyway.
            // A parameter this micro-batch does not use holds back no gradient bucket, as in
            // Engine::backward; what earlier micro-batches left in its .grad goes with its bucket.
            const bool boundary = in.micro_batch == gas - 1;
            if (boundary) s.stage->begin_backward(true);
            try {
              if (boundary) s.stage->expect_gradients_from(last ? b.loss : b.output);
              // An output that needs no gradient (every layer up to here frozen, as when only
              // the later layers are fine-tuned) has nothing to propagate: autograd would throw
              // "element 0 of tensors does not require grad" (as DeepSpeed's pipeline does).
              if (last)
                backward_loss(s, b.loss);
              else if (b.output.requires_grad())
                torch::autograd::backward({b.output}, {b.grad_output});
              if (boundary) s.stage->end_backward(true);
            } catch (...) {
              rethrow_after_clean_up(phase, [&] {
                if (boundary) zero::abandon_backward_quietly(*s.stage);
              });
            }
            b.output = at::Tensor();
            b.grad_output = at::Tensor();
            b.loss = at::Tensor();
            --rt.held;
            compute_s += seconds_since(t0);
            break;
          }
          case Op::SendGrad: {
            Buffer& b = bufs[in.buffer];
            at::Tensor g = b.input.grad();
            TORCH_CHECK(g.defined(), "pipeline: stage ", rt.stage,
                        " got no gradient for its input of micro-batch ", in.micro_batch,
                        " (is the activation used?)");
            link.send_grad(g);
            b = Buffer();
            break;
          }
          case Op::ReduceTiedGrads: {
            // After the data-parallel reduction (inside the boundary backward), see tied_layers.h.
            const auto t0 = Clock::now();
            reduce_tied_grads(rt.tied);
            step_s += seconds_since(t0);
            break;
          }
          case Op::ReduceGrads:
            break;  // done by the ZeRO stage inside the boundary micro-batch's backward
          case Op::OptimizerStep: {
            // Engine::step() applies the update at the accumulation boundary; the micro-steps of
            // this batch are counted first.
            const int64_t counted = s.micro_steps += gas - 1;
            // The other stages would print a loss they do not have; the tensor ranks of the last
            // stage all have it: their rank 0 prints.
            s.log_steps = last && rt.topology->coordinates().tensor == 0;
            const auto t0 = Clock::now();
            try {
              Engine::step();
            } catch (...) {
              // A step that threw before completing counted nothing: the retry counts the batch
              // again. (One that completed and then failed, writing its log, keeps its count.)
              if (s.micro_steps == counted) s.micro_steps -= gas - 1;
              throw;
            }
            step_s += seconds_since(t0);
            break;
          }
        }
      }
    }
  } catch (...) {
    rethrow_after_clean_up(phase, [&] {
      if (train) forget_failed_batch(*s.stage, rt.module, rt.held);
    });
  }

  const double loss = batch_loss(s, *rt.pipe, rt.stages, last, train, eval_loss);
  if (train) {
    s.last_loss = loss;
    rt.timing = {seconds_since(batch_start), compute_s, step_s};
  }
  return loss;
} catch (const c10::Error& e) {
  report_torch_error(train ? "train_batch" : "eval_batch", e);  // outside the instructions
}

}  // namespace pipe
}  // namespace deepspeed
