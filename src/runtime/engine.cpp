// The training step as one recipe; stage-specific work is delegated to the ZeroStage.
#include <torch/torch.h>

#include <cmath>
#include <cstdio>

#include "activation/rng_state.h"
#include "comm/failure_board.h"
#include "comm/gloo_communicator.h"
#include "comm/work.h"
#include "deepspeed/zero_unit.h"
#include "device/out_of_memory.h"
#include "monitor/training_monitor.h"
#include "precision/overflow_vote.h"
#include "runtime/engine_state.h"
#include "zero/abandon_backward.h"

namespace deepspeed {

void EngineStateDeleter::operator()(EngineState* state) const { delete state; }

Engine::Engine(EngineStatePtr state)
    : state_(std::move(state)),
      auto_cast_inputs_(state_->config.fp16.enabled && state_->config.fp16.auto_cast),
      device_(state_->device) {
  // The step line's first samples/s counts from where training began, not from here.
  state_->log.start_from(
      [monitor = state_->monitor.get()] { return monitor->timers().training_start(); });
  // timers.throughput: on a GPU, `synchronized` makes the printed interval end when its work has
  // run, not when it was queued (the CPU runs it as it is queued).
  const auto& throughput = state_->config.throughput_timer;
  std::function<void()> synchronize;
  if (throughput.synchronized && device_.is_cuda())
    synchronize = [index = device_.has_index() ? device_.index() : -1] {
      torch::cuda::synchronize(index);
    };
  state_->log.configure(throughput.enabled, std::move(synchronize));
  capture_rng_at_boundary(*state_);  // micro-step 0: a save before the first step() keeps these
}
Engine::~Engine() = default;

using monitor::Phase;

Engine::CallScope::CallScope(Engine& engine, const char* call, bool peers_wait_at_once)
    : state_(*engine.state_), call_(call), peers_wait_at_once_(peers_wait_at_once) {
  auto& s = state_;
  if (!s.failure_board_found) {  // every group of the job shares its world's board
    s.failure_board = comm::failure_board_of(s.topology ? *s.topology->world() : *s.comm);
    s.failure_board_found = true;
  }
  if (s.calls_open++ > 0 || !s.failure_board) return;
  outermost_ = true;
  try {
    s.failure_board->settle(call);
  } catch (...) {
    --s.calls_open;
    throw;
  }
  numbered_ = s.failure_board->numbered_total();
  posts_ = s.failure_board->own_posts();
  s.post_current_failure = [this] { failed(); };
}

Engine::CallScope::~CallScope() {
  --state_.calls_open;
  if (outermost_) state_.post_current_failure = nullptr;
}

void Engine::CallScope::failed() noexcept {
  if (!outermost_ || posted_) return;
  auto& board = *state_.failure_board;
  posted_ = true;
  // A call that issued nothing left the ranks' collectives matched: its retry issues them as the
  // failed call would have. One that tried and withdrew an operation whose start threw posts: a
  // peer may be waiting in it already.
  const bool issued = board.numbered_total() != numbered_;
  if ((!issued && !peers_wait_at_once_) || board.own_posts() != posts_) return;
  board.post(call_, comm::current_exception_message());
}

void capture_rng_at_boundary(EngineState& s) {
  s.rng_at_boundary.cpu = checkpointing::generator_state(c10::kCPU);
  s.rng_at_boundary.cuda =
      s.device.is_cuda() ? checkpointing::generator_state(s.device) : at::Tensor();
}

comm::Communicator& job_comm(const EngineState& s) {
  return s.topology ? *s.topology->world() : *s.comm;
}

bool between_boundaries(const EngineState& s) {
  return s.micro_steps % s.config.gradient_accumulation_steps != 0 ||
         s.loss_since_boundary.defined();
}

at::Tensor divided_by_accumulation(const at::Tensor& loss, int64_t accumulation_steps) {
  if (accumulation_steps <= 1) return loss;
  const bool reduced = loss.scalar_type() == at::kBFloat16 || loss.scalar_type() == at::kHalf;
  return (reduced ? loss.to(at::kFloat) : loss) / static_cast<double>(accumulation_steps);
}

void complete_handed_over_step(const EngineState& s) {
  if (s.stage) s.stage->complete_step();
}

void require_whole_step(const EngineState& s, const std::string& what) {
  refuse_during_half_done_step(s, what);
  complete_handed_over_step(s);
}

void refuse_inside_gathered_scope(const EngineState& s, const std::string& what) {
  if (!s.stage || !s.stage->gathered_scope_open()) return;
  throw Error(what + " inside a gathered_parameters scope on rank " +
              std::to_string(s.comm->rank()) +
              ": end the scope first (its copies of the parameters would be stale after it, and "
              "a modifier rank's scope would write them back over it)");
}

void refuse_during_half_done_step(const EngineState& s, const std::string& what) {
  if (!s.stage || !s.stage->update_begun_during_backward()) return;
  throw Error(what + " between an accumulation boundary's backward and engine.step(): ZeRO-Offload's "
              "update during backward (zero_optimization.offload_optimizer.overlap_step) has "
              "already updated part of rank " + std::to_string(s.comm->rank()) +
              "'s optimizer state and parameters, so it would see half of a step; call "
              "engine.step() first (or set overlap_step to false)");
}

void refuse_to_save_a_lost_step(const EngineState& s) {
  if (!s.stage || !s.stage->step_lost()) return;
  throw Error("save_checkpoint: rank " + std::to_string(s.comm->rank()) + "'s optimizer state is "
              "partly stepped: a boundary's backward (or its step) failed after ZeRO-Offload's "
              "update during backward (zero_optimization.offload_optimizer.overlap_step), or a "
              "step of the optimizer swapped to offload_optimizer.nvme_path, had updated part of "
              "it, and a checkpoint of it would keep half a step; load the last checkpoint "
              "instead");
}

namespace {
// An engine built without an optimizer evaluates only; DeepSpeed asserts the same in backward()
// and step() ("must provide optimizer during init in order to use backward").
void refuse_without_optimizer(const EngineState& s, const char* call) {
  if (s.optimizer) return;
  throw Error(std::string("engine.") + call + "(): must provide optimizer during init in order to "
              "use " + call + ": this engine was built without one (the config has no "
              "\"optimizer\" block and initialize() got no InitializeArgs.optimizer), so it "
              "can only evaluate (forward)");
}
}  // namespace

void Engine::before_forward() {
  forget_failed_allocation();
  refuse_during_half_done_step(*state_, "forward");
  state_->monitor->timers().start(Phase::kForward);
  state_->monitor->before_forward(state_->global_steps);  // flops profiler at its step
  state_->stage->before_forward();
}
void Engine::after_forward() {
  state_->monitor->after_forward();
  state_->monitor->timers().stop(Phase::kForward);
}

bool Engine::is_gradient_accumulation_boundary() const {
  return (state_->micro_steps + 1) % state_->config.gradient_accumulation_steps == 0;
}

void Engine::report_torch_error(const char* phase, const c10::Error& error) const {
  std::rethrow_exception(translate_torch_error(phase, error));
}

std::exception_ptr Engine::translate_torch_error(const char* phase, const c10::Error& error) const {
  const std::string message = error.what_without_backtrace();
  const std::string where =
      "rank " + std::to_string(state_->comm->rank()) + ", " + phase + ": " + message;
  // With no named buffer of deepspeed's being allocated, what ran out is most likely the model's.
  const std::string p = phase;
  const char* model_tensors = p == "forward"    ? "activations"
                              : p == "backward" ? "activations' gradients"
                              : p == "step"     ? nullptr
                                                : "activations or their gradients";
  if (auto oom = out_of_memory_message(
          message, "rank " + std::to_string(state_->comm->rank()) + "'s " + phase,
          state_->config.zero_optimization.stage, state_->device, take_failed_allocation(),
          model_tensors))
    return std::make_exception_ptr(Error(*oom));
  // libtorch 1.13's CPU kernels lack Half for layer norm, matmul and others; bf16 has them all.
  // On CUDA fp16 runs natively: there a Half error is the model's, reported as any other.
  if (state_->device.is_cpu() && state_->config.fp16.enabled &&
      message.find("'Half'") != std::string::npos)
    return std::make_exception_ptr(ConfigError(
        "fp16.enabled: the model uses an operator that this libtorch has no CPU fp16 (Half) "
        "kernel for (" + where + "); use \"bf16\": {\"enabled\": true} instead (CPU bf16 kernels "
        "exist for every operator) or train in fp32"));
  return std::make_exception_ptr(Error(where));
}

void Engine::rethrow_after_clean_up(const char* phase,
                                    const std::function<void()>& clean_up) const {
  if (state_->post_current_failure) state_->post_current_failure();
  std::exception_ptr reported = std::current_exception();
  try {
    throw;
  } catch (const c10::Error& e) {
    reported = translate_torch_error(phase, e);
  } catch (...) {  // anything else (a user's hook may throw what it likes) goes on as it is
  }
  clean_up();
  std::rethrow_exception(reported);
}

// backward_in() and step_in() are function-try-blocks: a libtorch error anywhere in them (the
// stage's hooks and collectives included) reaches the user through report_torch_error.
at::Tensor Engine::backward(const at::Tensor& loss) {
  return in_call("backward", [&] { return backward_in(loss); });
}

at::Tensor Engine::backward_in(const at::Tensor& loss) try {
  forget_failed_allocation();
  auto& s = *state_;
  refuse_without_optimizer(s, "backward");
  auto& timers = s.monitor->timers();
  timers.start(Phase::kBackward);
  TORCH_CHECK(loss.numel() == 1, "engine.backward: loss must be a scalar, got shape ", loss.sizes());
  at::Tensor scaled = divided_by_accumulation(loss, s.config.gradient_accumulation_steps);
  // fp16: the loss is multiplied by the loss scale (in fp32) so small gradients survive in fp16;
  // the step divides it out again. bf16/fp32: the scale is 1 and nothing changes.
  at::Tensor to_differentiate = scaled;
  const double loss_scale = s.loss_scaler->scale();
  if (loss_scale != 1.0) to_differentiate = scaled.to(torch::kFloat) * loss_scale;

  const bool boundary = is_gradient_accumulation_boundary();
  s.stage->begin_backward(boundary);
  try {
    // Parameters this loss does not use hold back no gradient bucket (find_unused_parameters).
    s.stage->expect_gradients_from(to_differentiate);
    timers.start(Phase::kBackwardInner);
    to_differentiate.backward();
    timers.stop(Phase::kBackwardInner);
    timers.start(Phase::kBackwardReduce);
    s.stage->end_backward(boundary);
    timers.stop(Phase::kBackwardReduce);
  } catch (...) {
    rethrow_after_clean_up("backward", [&] { zero::abandon_backward_quietly(*s.stage); });
  }
  // Counted once its backward went through: a micro-step whose backward threw (and is retried,
  // or skipped) is not part of the step's mean loss.
  at::Tensor detached = scaled.detach().to(torch::kDouble);
  s.loss_since_boundary =
      s.loss_since_boundary.defined() ? s.loss_since_boundary + detached : detached;
  timers.stop(Phase::kBackward);
  return scaled;
} catch (const c10::Error& e) {
  report_torch_error("backward", e);
}

void Engine::step() {
  in_call("step", [&] { step_in(); });
}

void Engine::complete_step() {
  in_call("complete_step", [&] { complete_handed_over_step(*state_); });
}

void Engine::step_in() try {
  forget_failed_allocation();
  auto& s = *state_;
  refuse_without_optimizer(s, "step");
  auto& timers = s.monitor->timers();
  timers.start(Phase::kStep);
  if (!is_gradient_accumulation_boundary()) {
    ++s.micro_steps;
    s.last_step_applied = false;  // DeepSpeed: false between boundaries
    timers.stop(Phase::kStep);
    return;
  }
  refuse_inside_gathered_scope(s, "engine.step()");
  // Before anything of the step happens: a step called again after it threw finds the same.
  if (s.unused_parameters) s.unused_parameters->check_step(*s.comm, job_comm(s), s.device);
  // Mean training loss over the data-parallel ranks: one scalar all-reduce per optimizer step.
  // Reduced in a copy, and the sum dropped only once the step went through: a step called again
  // after it threw reports the same loss.
  at::Tensor loss = s.loss_since_boundary.defined()
                        ? s.loss_since_boundary.reshape({1}).clone()
                        : torch::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(s.device));
  s.comm->all_reduce(loss)->wait();

  // The norm of the still-scaled gradients; non-finite on every rank if any rank overflowed.
  // Read here only when the step needs its value (the overflow vote: fp16, or bf16 with
  // bf16.check_grad_overflow; clipping): that read is the step's one wait for the device, and
  // the loss, queued before it, is read after it, when it is already there. Otherwise both stay
  // on the device until asked for (settle_figures).
  const double loss_scale = s.loss_scaler->scale();
  s.pending = {loss, s.stage->global_grad_norm_tensor(), loss_scale};
  const bool votes = precision::votes_on_overflow(s.config);
  const bool needs_norm = votes || s.config.gradient_clipping > 0.0;
  const double scaled_norm = needs_norm ? s.pending.scaled_norm.item<double>() : 0.0;
  // Without the vote (fp32, bf16 by default) a non-finite gradient is applied, as DeepSpeed does.
  const bool overflow = votes && !std::isfinite(scaled_norm);
  if (needs_norm) {
    s.last_loss = loss.item<double>() / s.comm->world_size();
    s.pending = {};
  }
  // The loss scaler counts an applied step only once the stage has applied it: a stage step that
  // throws (and a pipeline batch that is retried) must not count twice in its window.
  s.last_step_applied = false;
  if (overflow) {
    // DeepSpeed: the update and the LR step are skipped, the step is still counted.
    // The scaler first: at min_loss_scale it throws with nothing changed, and a step() called
    // again finds the same overflow (not zeroed gradients to step with). bf16's scaler is static
    // (scale 1): update(true) changes nothing and has nothing to say.
    s.loss_scaler->update(true);
    s.stage->discard_gradients();
    s.loss_since_boundary = at::Tensor();
    ++s.skipped_steps;
    // Once per job, as DeepSpeed's "Rank 0" says: a pipeline's stages (and a tensor group's
    // ranks) each have their own data-parallel rank 0, and all of them skip this step together.
    if (s.topology->world()->rank() == 0) {
      // DeepSpeed's line, without the loss scale part a static scale has no use for.
      const std::string message = s.config.bf16.enabled
                                      ? "[deepspeed] OVERFLOW! Rank 0 Skipping step: "
                                        "bf16.check_grad_overflow found inf/NaN gradients"
                                      : s.loss_scaler->last_message();
      if (!message.empty()) {
        std::printf("%s\n", message.c_str());
        std::fflush(stdout);
      }
    }
  } else {
    // A step the schedule cannot take is refused before the update, so nothing has changed.
    if (s.scheduler) s.scheduler->check_next_step();
    if (needs_norm) s.last_grad_norm = scaled_norm / loss_scale;
    // DeepSpeed/PyTorch clipping: coefficient max_norm / (norm + 1e-6), applied only when < 1.
    // Un-scaling and clipping are one multiplication inside the optimizer step.
    double grad_scale = 1.0 / loss_scale;
    if (s.config.gradient_clipping > 0.0) {
      double coef = s.config.gradient_clipping / (s.last_grad_norm + 1e-6);
      if (coef < 1.0) grad_scale *= coef;
    }
    s.stage->step(grad_scale);
    s.loss_since_boundary = at::Tensor();
    s.loss_scaler->update(false);
    s.last_step_applied = true;
    if (s.scheduler) s.scheduler->step();
  }
  ++s.global_steps;
  s.global_samples += s.config.train_batch_size;
  if (s.loader) s.loader_at_boundary = s.loader->state();
  ++s.micro_steps;
  capture_rng_at_boundary(s);
  const bool writer = s.log_steps && s.comm->rank() == 0;
  const int64_t every = s.config.steps_per_print;
  if (writer && ((every > 0 && s.global_steps % every == 0) || s.monitor->monitor()->enabled()))
    s.settle_figures();  // this step's line or events show them
  StepLogLine line{s.global_steps, s.last_loss, get_lr(), s.last_grad_norm,
                   s.config.train_batch_size, s.skipped_steps,
                   s.config.fp16.enabled ? s.loss_scaler->scale() : 0.0};
  timers.stop(Phase::kStep);
  s.log.on_step(line, s.config.steps_per_print, writer);
  s.monitor->on_step({s.global_steps, s.global_samples, s.last_loss,
                      line.lr.empty() ? 0.0 : line.lr[0], s.loss_scaler->scale(),
                      s.config.fp16.enabled, s.last_grad_norm, s.config.train_batch_size},
                     writer);
} catch (const c10::Error& e) {
  report_torch_error("step", e);
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
double Engine::get_global_grad_norm() const {
  state_->settle_figures();
  return state_->last_grad_norm;
}
bool Engine::was_step_applied() const { return state_->last_step_applied; }
double Engine::loss_scale() const { return state_->loss_scaler->scale(); }
double Engine::last_loss() const {
  state_->settle_figures();
  return state_->last_loss;
}
torch::nn::Module& Engine::module() { return *state_->module; }
const Config& Engine::config() const { return state_->config; }
comm::CommunicatorPtr Engine::communicator() const { return state_->comm; }
std::shared_ptr<torch::optim::Optimizer> Engine::optimizer() const { return state_->optimizer; }
std::shared_ptr<LRScheduler> Engine::lr_scheduler() const { return state_->scheduler; }
std::shared_ptr<DataLoader> Engine::training_dataloader() const { return state_->loader; }
MemoryReport Engine::memory_report() const { return state_->stage->memory(); }
std::shared_ptr<monitor::Monitor> Engine::monitor() const { return state_->monitor->monitor(); }
std::string Engine::see_memory_usage(const std::string& message, bool force) const {
  if (!force) return "";
  return state_->monitor->see_memory_usage(message, /*print=*/state_->comm->rank() == 0);
}
std::string Engine::comms_summary() const {
  return state_->monitor->comms_summary(/*print=*/state_->comm->rank() == 0);
}

GatheredParameters& GatheredParameters::operator=(GatheredParameters&& o) noexcept {
  if (this != &o) {
    GatheredParameters old(std::move(*this));
    release_ = std::move(o.release_);
    o.release_ = nullptr;
  }
  return *this;
}

GatheredParameters::~GatheredParameters() {
  try {
    release();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "GatheredParameters: re-partitioning failed: %s\n", e.what());
  }
}

void GatheredParameters::release() {
  auto fn = std::move(release_);
  release_ = nullptr;
  if (fn) fn();
}

GatheredParameters Engine::gathered_parameters(std::optional<int> modifier_rank) {
  return gathered_parameters({}, modifier_rank);
}

GatheredParameters Engine::gathered_parameters(
    const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
    std::optional<int> modifier_rank) {
  return in_call("gathered_parameters", [&] {
    require_whole_step(*state_, "gathered_parameters");
    // The release is collective too (a modifier rank's broadcast, its writes to the partition):
    // one that fails on one rank posts, so its peers' next collective ends at once, naming it.
    return GatheredParameters(
        [this, release = state_->stage->gather_for_access(modules, modifier_rank)] {
          in_call("gathered_parameters (release)", release);
        });
  });
}

// Walks the module tree in named_parameters() order; a unit (or a leaf module) is gathered as a
// whole, so at most one unit's full parameters exist at a time. A module that is not a unit holds
// only root-unit parameters itself (always gathered), so it is copied directly and its children
// visited.
std::vector<std::pair<std::string, at::Tensor>> Engine::consolidated_state_dict() {
  return in_call("consolidated_state_dict", [&] { return consolidated_state_dict_in(); });
}

std::vector<std::pair<std::string, at::Tensor>> Engine::consolidated_state_dict_in() {
  require_whole_step(*state_, "consolidated_state_dict");
  auto& model = *state_->module;
  const bool keep = state_->comm->rank() == 0;
  std::vector<std::pair<std::string, at::Tensor>> out;
  auto copy = [&](const std::string& prefix, torch::nn::Module& m, bool recurse) {
    if (!keep) return;
    for (auto& kv : m.named_parameters(recurse))
      out.emplace_back(prefix + kv.key(), kv.value().detach().clone());
  };
  std::function<void(const std::string&, const std::shared_ptr<torch::nn::Module>&)> visit =
      [&](const std::string& prefix, const std::shared_ptr<torch::nn::Module>& m) {
        if (dynamic_cast<ZeroUnitBase*>(m.get()) || m->children().empty()) {
          auto scope = gathered_parameters({m});
          copy(prefix, *m, /*recurse=*/true);
          return;
        }
        copy(prefix, *m, /*recurse=*/false);
        for (auto& kv : m->named_children()) visit(prefix + kv.key() + ".", kv.value());
      };
  if (dynamic_cast<ZeroUnitBase*>(&model)) {
    auto scope = gathered_parameters();
    copy("", model, /*recurse=*/true);
  } else {
    copy("", model, /*recurse=*/false);
    for (auto& kv : model.named_children()) visit(kv.key() + ".", kv.value());
  }
  if (keep)
    for (auto& kv : model.named_buffers()) out.emplace_back(kv.key(), kv.value().detach().clone());
  return out;
}

}  // namespace deepspeed
