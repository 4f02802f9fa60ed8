// PipelineEngine's face: the Engine calls a pipeline refuses, the stage's accessors, and
// train_batch / eval_batch choosing the schedule that run() (schedule_interpreter.cpp) executes.
// Building the engine is initialize_pipeline.cpp's; the state both share is pipeline_runtime.h.
#include <torch/torch.h>

#include "pipe/pipeline_runtime.h"

namespace deepspeed {
namespace pipe {

PipelineEngine::PipelineEngine(EngineStatePtr state, std::unique_ptr<PipelineRuntime> runtime)
    : Engine(std::move(state)), rt_(std::move(runtime)) {}
PipelineEngine::~PipelineEngine() = default;

at::Tensor PipelineEngine::forward(const at::Tensor&) {
  throw Error("PipelineEngine: forward() is not available with pipeline parallelism; call "
              "train_batch(data) (or eval_batch) for a whole batch");
}
at::Tensor PipelineEngine::backward(const at::Tensor&) {
  throw Error("PipelineEngine: backward() is not available with pipeline parallelism; call "
              "train_batch(data), which runs forward, backward and step");
}
void PipelineEngine::step() {
  throw Error("PipelineEngine: step() is not available with pipeline parallelism; call "
              "train_batch(data), which runs forward, backward and step");
}

int PipelineEngine::stage_id() const { return rt_->stage; }
int PipelineEngine::num_stages() const { return rt_->stages; }
const Partition& PipelineEngine::partition() const { return rt_->partition; }
int PipelineEngine::max_activations_held() const { return rt_->max_held; }
PipelineEngine::BatchTiming PipelineEngine::last_batch_timing() const { return rt_->timing; }
Schedule PipelineEngine::schedule() const {
  return train_schedule(static_cast<int>(gradient_accumulation_steps()), rt_->stages, rt_->stage);
}

double PipelineEngine::train_batch(const DataIterator& data) {
  // Checked on every rank before any transfer (grad mode is the caller's thread's), as DeepSpeed
  // asserts it: under NoGradGuard the last stage's backward would fail on a loss without a graph
  // and the other stages would wait on it.
  if (!at::GradMode::is_enabled())
    throw Error("train_batch() requires gradients enabled (called under torch::NoGradGuard?); "
                "use eval_batch() for evaluation");
  // Every rank alike, before any transfer, as backward() and step() refuse it (engine.cpp).
  if (!optimizer())
    throw Error("train_batch(): must provide optimizer during init in order to use train_batch: "
                "this engine was built without one (the config has no \"optimizer\" block and "
                "initialize_pipeline() got no optimizer); use eval_batch() for evaluation");
  // With more than one stage the neighbours block on this stage's first transfer at once.
  return in_call("train_batch", [&] { return run(schedule(), data, /*train=*/true); },
                 /*peers_wait_at_once=*/rt_->stages > 1);
}

double PipelineEngine::eval_batch(const DataIterator& data) {
  return in_call("eval_batch", [&] {
    torch::NoGradGuard no_grad;
    rt_->module->eval();
    double loss = 0.0;
    try {
      loss = run(inference_schedule(static_cast<int>(gradient_accumulation_steps()), rt_->stages,
                                    rt_->stage),
                 data, /*train=*/false);
    } catch (...) {
      rt_->module->train();
      throw;
    }
    rt_->module->train();
    return loss;
  }, /*peers_wait_at_once=*/rt_->stages > 1);
}

}  // namespace pipe
}  // namespace deepspeed
