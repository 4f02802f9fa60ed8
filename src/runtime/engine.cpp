// The training step as one recipe; stage-specific work is delegated to the ZeroStage.
#include <torch/torch.h>

#include "runtime/engine_state.h"

namespace deepspeed {

void EngineStateDeleter::operator()(EngineState* state) const { delete state; }

Engine::Engine(EngineStatePtr state) : state_(std::move(state)) { state_->log.start(); }
Engine::~Engine() = default;

void Engine::before_forward() {}
void Engine::after_forward() {}

bool Engine::is_gradient_accumulation_boundary() const {
  return (state_->micro_steps + 1) % state_->config.gradient_accumulation_steps == 0;
}

at::Tensor Engine::backward(const at::Tensor& loss) {
  auto& s = *state_;
  TORCH_CHECK(loss.numel() == 1, "engine.backward: loss must be a scalar, got shape ", loss.sizes());
  at::Tensor scaled = loss;
  if (s.config.gradient_accumulation_steps > 1) scaled = loss / s.config.gradient_accumulation_steps;
  at::Tensor detached = scaled.detach().to(torch::kDouble);
  s.loss_since_boundary =
      s.loss_since_boundary.defined() ? s.loss_since_boundary + detached : detached;

  const bool boundary = is_gradient_accumulation_boundary();
  s.stage->begin_backward(boundary);
  scaled.backward();
  s.stage->end_backward(boundary);
  return scaled;
}

void Engine::step() {
  auto& s = *state_;
  if (!is_gradient_accumulation_boundary()) {
    ++s.micro_steps;
    return;
  }
  TORCH_CHECK(s.optimizer, "engine.step: no optimizer (give an \"optimizer\" block in the config "
                           "or pass one to initialize())");
  // Mean training loss over ranks: one scalar all-reduce per optimizer step.
  at::Tensor loss = s.loss_since_boundary.defined() ? s.loss_since_boundary.reshape({1})
                                                     : torch::zeros({1}, torch::kDouble);
  s.comm->all_reduce(loss)->wait();
  s.last_loss = loss.item<double>() / s.comm->world_size();
  s.loss_since_boundary = at::Tensor();

  s.last_grad_norm = s.stage->global_grad_norm();
  double scale = 1.0;
  // DeepSpeed/PyTorch clipping: coefficient max_norm / (norm + 1e-6), applied only when < 1.
  if (s.config.gradient_clipping > 0.0) {
    double coef = s.config.gradient_clipping / (s.last_grad_norm + 1e-6);
    if (coef < 1.0) scale = coef;
  }
  s.stage->step(scale);
  if (s.scheduler) s.scheduler->step();
  ++s.global_steps;
  s.global_samples += s.config.train_batch_size;
  ++s.micro_steps;
  s.log.on_step(s.global_steps, s.config.steps_per_print, s.comm->rank() == 0, s.last_loss, get_lr(),
                s.last_grad_norm, s.config.train_batch_size);
}

int64_t Engine::train_batch_size() const { return state_->config.train_batch_size; }
int64_t Engine::train_micro_batch_size_per_gpu() const {
  return state_->config.train_micro_batch_size_per_gpu;
}
int64_t Engine::gradient_accumulation_steps() const {
  return state_->config.gradient_accumulation_steps;
}
std::vector<double> Engine::get_lr() const {
  std::vector<double> lrs;
  if (!state_->optimizer) return lrs;
  for (auto& g : state_->optimizer->param_groups()) lrs.push_back(g.options().get_lr());
  return lrs;
}
int64_t Engine::global_steps() const { return state_->global_steps; }
int64_t Engine::global_samples() const { return state_->global_samples; }
int64_t Engine::micro_steps() const { return state_->micro_steps; }
int64_t Engine::skipped_steps() const { return state_->skipped_steps; }
double Engine::get_global_grad_norm() const { return state_->last_grad_norm; }
double Engine::last_loss() const { return state_->last_loss; }
torch::nn::Module& Engine::module() { return *state_->module; }
const Config& Engine::config() const { return state_->config; }
comm::CommunicatorPtr Engine::communicator() const { return state_->comm; }
std::shared_ptr<torch::optim::Optimizer> Engine::optimizer() const { return state_->optimizer; }
std::shared_ptr<LRScheduler> Engine::lr_scheduler() const { return state_->scheduler; }
MemoryReport Engine::memory_report() const { return state_->stage->memory(); }

}  // namespace deepspeed
