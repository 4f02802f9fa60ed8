// Everything an Engine owns. Private: users see only include/deepspeed/engine.h.
#pragma once
#include <chrono>
#include <c10/core/Device.h>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/layout.h"
#include "deepspeed/engine.h"
#include "deepspeed/lr_scheduler.h"
#include "deepspeed/topology.h"
#include "precision/loss_scaler.h"
#include "runtime/throughput_log.h"
#include "runtime/unused_parameters.h"
#include "zero/stage.h"

namespace deepspeed {
namespace monitor {
class TrainingMonitor;
}  // namespace monitor
namespace comm {
class FailureBoard;
}  // namespace comm

struct EngineState {
  Config config;
  std::shared_ptr<comm::Topology> topology;  // the world's pipe x data x tensor grid
  comm::CommunicatorPtr comm;                 // topology->data_parallel(): gradients, loss mean
  // Where the ZeRO stage keeps parameters, gradients and buckets (zero::StageContext). The CPU
  // here; a CUDA engine gives its device.
  c10::Device device = c10::kCPU;
  std::shared_ptr<torch::nn::Module> module;
  // Parameters with requires_grad, in registration order, each once: a tied parameter (embedding
  // = head) under the first name named_parameters() gives it. trainable_names[k] names
  // trainable[k] (the checkpoint's fragments and masters go by these names).
  std::vector<at::Tensor> trainable;
  std::vector<std::string> trainable_names;
  // Every later name of a parameter registered under several (alias -> first name, trainable or
  // frozen): DeepSpeed's shared_params, saved in the model-states file's metadata.
  std::vector<std::pair<std::string, std::string>> shared_params;
  std::shared_ptr<torch::optim::Optimizer> optimizer;
  std::shared_ptr<LRScheduler> scheduler;
  std::unique_ptr<zero::ZeroStage> stage;
  // zero_optimization.ignore_unused_parameters false at stages 1-3: fails a step in which a
  // trainable parameter got no gradient (runtime/unused_parameters.h). Null otherwise.
  std::unique_ptr<UnusedParameterCheck> unused_parameters;
  // Never null: dynamic or static for fp16, a static scale of 1 otherwise.
  std::unique_ptr<precision::LossScaler> loss_scaler;
  std::shared_ptr<Dataset> training_data;
  std::shared_ptr<DataLoader> loader;
  // The loader's position when the last optimizer step ended (or the job started or loaded): a
  // checkpoint saved between boundaries saves this one, since its partial accumulation is not in
  // the checkpoint and the resumed job must train those micro-batches again.
  LoaderState loader_at_boundary;
  // The generators' states at the same moment (the end of a boundary step(), initialize, a load),
  // for the same reason: the resumed job must draw the replayed micro-batches' dropout masks
  // again. `cpu`: the CPU generator (~5 KB); `cuda`: the engine's CUDA device's generator (a seed
  // and an offset), undefined on a CPU engine. One get_state copy of each per boundary.
  struct GeneratorStates {
    at::Tensor cpu, cuda;
  } rng_at_boundary;

  int64_t global_steps = 0;
  int64_t global_samples = 0;
  int64_t micro_steps = 0;
  int64_t skipped_steps = 0;
  double last_grad_norm = 0.0;
  bool last_step_applied = false;
  double last_loss = std::numeric_limits<double>::quiet_NaN();
  // A step that needs neither value (no clipping, no fp16 vote) leaves its loss and gradient norm
  // on the device, unread: reading them would make the host wait for the GPU at every step.
  // settle_figures() reads them into last_loss / last_grad_norm when something asks (the
  // getters, the steps_per_print line, a monitor, the pipeline's batch loss).
  struct PendingFigures {
    at::Tensor loss_sum;     // the all-reduced sum of the ranks' losses
    at::Tensor scaled_norm;  // the gradient norm before un-scaling
    double loss_scale = 1.0;
  } pending;
  void settle_figures() {
    if (pending.loss_sum.defined())
      last_loss = pending.loss_sum.item<double>() / comm->world_size();
    if (pending.scaled_norm.defined())
      last_grad_norm = pending.scaled_norm.item<double>() / pending.loss_scale;
    pending = {};
  }
  at::Tensor loss_since_boundary;  // sum of the GAS-scaled micro losses since the last step
  ThroughputLog log;
  // Monitors, wall_clock_breakdown timers and the comms logger (src/monitor/training_monitor.h).
  // Never null after build_engine_state.
  std::shared_ptr<monitor::TrainingMonitor> monitor;
  // Whether this engine prints the steps_per_print line (on its data-parallel rank 0). A pipeline
  // turns it off on all but the last stage, the only one that knows the loss when it steps.
  bool log_steps = true;
  // A pipeline stage's checkpoint layout (per-layer files; set by initialize_pipeline). Null: one
  // model-states file.
  std::shared_ptr<const checkpoint::PipelineFiles> pipeline_files;
  // The job's failure board (comm/failure_board.h; null at world size 1, with NCCL and with test
  // doubles), found at the first engine call, and how many Engine::CallScopes are open.
  std::shared_ptr<comm::FailureBoard> failure_board;
  bool failure_board_found = false;
  int calls_open = 0;
  // The outermost open CallScope's failed(), for rethrow_after_clean_up; empty outside a call.
  std::function<void()> post_current_failure;
};

namespace detail {
// The library's (and its tests') way to an engine's state; Engine befriends it so that the
// public header needs no accessor.
struct EngineAccess {
  static EngineState& state(Engine& engine) { return *engine.state_; }
};
}  // namespace detail

inline EngineState& state_of(Engine& engine) { return detail::EngineAccess::state(engine); }

// Reads the generators' states into s.rng_at_boundary: REQUIRES s.micro_steps at a boundary
// (a step() that ended one, initialize, a load), before anything of the next micro-step draws.
void capture_rng_at_boundary(EngineState& s);
// Whether the engine is between accumulation boundaries: a step() or a backward since the last
// boundary, whose gradients a checkpoint does not keep (it saves the boundary's loader position
// and generator states instead).
bool between_boundaries(const EngineState& s);

// Every rank of the job: the topology's world (a pipeline's stages and the tensor ranks
// together), else the engine's (data-parallel) communicator. A checkpoint's ranks save into one
// tag over it; the unused-parameter check agrees over it.
comm::Communicator& job_comm(const EngineState& s);

// Throws deepspeed::Error when `what` (a forward, a checkpoint's save or load, a look at the whole
// parameters) comes between an accumulation boundary's backward and engine.step() while
// ZeRO-Offload's update during backward has already updated part of the optimizer partition:
// it would read or overwrite half of a step (and race the update's thread). Local; every rank
// of the job is in the same state.
void refuse_during_half_done_step(const EngineState& s, const std::string& what);
// offload_optimizer.overlap_forward: the update engine.step() handed over to the next forward
// is waited for (zero/forward_waits.h). Local. A failed update throws.
void complete_handed_over_step(const EngineState& s);
// What reads the whole parameters or the optimizer state outside a forward (`what`: a checkpoint
// call, gathered_parameters, ...) calls this first: refuse_during_half_done_step, then
// complete_handed_over_step.
void require_whole_step(const EngineState& s, const std::string& what);
// `what` (a step, a checkpoint load) inside an open gathered_parameters scope: its copies of the
// parameters would be stale after it, and a modifier rank's scope would write them back over it.
// Every rank has the same scopes open, so every rank refuses alike; call before any collective.
void refuse_inside_gathered_scope(const EngineState& s, const std::string& what);
// Throws deepspeed::Error when a step the update during backward had begun was never completed
// (ZeroStage::step_lost): a checkpoint saved now would keep a partly stepped optimizer state.
void refuse_to_save_a_lost_step(const EngineState& s);
// A micro-step's loss divided by the accumulation steps (the engine's backward and a pipeline's
// last stage): a 16-bit loss in fp32, as DeepSpeed's loss.float() (bf16(1/3) is 0.2% off, in every
// gradient of the step).
at::Tensor divided_by_accumulation(const at::Tensor& loss, int64_t accumulation_steps);

}  // namespace deepspeed
