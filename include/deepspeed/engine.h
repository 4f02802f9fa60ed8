// The training engine: what deepspeed::initialize() returns first.
//
// The loop is DeepSpeed's, called once per micro-batch:
//     auto loss = engine->forward(x, y);   // runs the model's forward
//     engine->backward(loss);              // scales by 1/gradient_accumulation_steps, reduces grads
//     engine->step();                      // optimizer step only at accumulation boundaries
// All three are COLLECTIVE across the data-parallel group (every rank calls them the same number of
// times): gradients are reduced inside backward()/step(). Not thread-safe; one engine per thread.
#pragma once
#include <cstdint>
#include <functional>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "deepspeed/comm.h"
#include "deepspeed/config.h"
#include "deepspeed/data.h"
#include "deepspeed/device.h"
#include "deepspeed/memory.h"
#include "deepspeed/monitor.h"

namespace deepspeed {
namespace comm {
class Topology;
}  // namespace comm

class LRScheduler;
struct EngineState;
// Owns the engine's private state; the deleter is defined in the library, so user code never
// needs EngineState's definition.
struct EngineStateDeleter {
  void operator()(EngineState* state) const;
};
using EngineStatePtr = std::unique_ptr<EngineState, EngineStateDeleter>;
namespace detail {
struct EngineAccess;
}  // namespace detail

// A scope in which ZeRO-3's partitioned parameters are whole (DeepSpeed's GatheredParameters).
// Its end (destructor or release()) is COLLECTIVE: it re-partitions the parameters, keeping the
// modifier rank's edits. It is an engine call, so end it before the engine is destroyed. Edit
// parameters in place (under torch::NoGradGuard), not with set_data.
// Stages 0-2 hold whole parameters already: the scope does nothing there.
class GatheredParameters {
 public:
  GatheredParameters() = default;
  explicit GatheredParameters(std::function<void()> release) : release_(std::move(release)) {}
  GatheredParameters(GatheredParameters&& o) noexcept : release_(std::move(o.release_)) {
    o.release_ = nullptr;
  }
  GatheredParameters& operator=(GatheredParameters&& o) noexcept;
  GatheredParameters(const GatheredParameters&) = delete;
  GatheredParameters& operator=(const GatheredParameters&) = delete;
  // A failure while re-partitioning is printed to stderr (destructors must not throw); call
  // release() first to get it as an exception.
  ~GatheredParameters();
  void release();

 private:
  std::function<void()> release_;
};

// What Engine::load_checkpoint returns (DeepSpeed's (load_path, client_state) tuple).
struct LoadedCheckpoint {
  std::string load_path;       // the model-states file loaded; empty when there was nothing to load
  nlohmann::json client_state;  // the client_state given to save_checkpoint; null when nothing loaded
};

class Engine {
 public:
  virtual ~Engine();

  // Scales the loss by 1/gradient_accumulation_steps and runs autograd; gradient reduction of the
  // configured ZeRO stage runs inside (overlapped with backward when overlap_comm is on).
  // Returns the scaled loss. COLLECTIVE. Throws deepspeed::Error on an engine built without an
  // optimizer (as step()).
  at::Tensor backward(const at::Tensor& loss);
  // At an accumulation boundary: clip by global norm, optimizer step, LR scheduler step, zero grads.
  // Between boundaries only counts the micro-step. COLLECTIVE.
  void step();
  // With zero_optimization.offload_optimizer.overlap_forward, step() returns while the CPU Adam
  // still updates the parameters the next forward reads last; with
  // zero_optimization.overlap_param_gather, while the updated partitions are still being
  // all-gathered (each ZeroUnit waits for its own). This waits for all of it: call it before
  // reading the module's parameters yourself between step() and the next forward. The engine's
  // own readers (backward, checkpoints, gathered_parameters, consolidated_state_dict) call it.
  // Nothing to wait for otherwise. Local.
  void complete_step();

  bool is_gradient_accumulation_boundary() const;
  int64_t train_batch_size() const;
  int64_t train_micro_batch_size_per_gpu() const;
  int64_t gradient_accumulation_steps() const;
  std::vector<double> get_lr() const;
  int64_t global_steps() const;
  int64_t global_samples() const;
  int64_t micro_steps() const;
  int64_t skipped_steps() const;
  // Global gradient norm (unscaled, before clipping) of the last applied optimizer step; 0 before
  // the first.
  double get_global_grad_norm() const;
  // Whether the last step() updated the weights: false between accumulation boundaries and when an
  // fp16 overflow skipped the step.
  bool was_step_applied() const;
  // The current fp16 loss scale (1 for fp32 and bf16 training).
  double loss_scale() const;
  // Mean over the data-parallel ranks of the loss of the last optimizer step (sum of the
  // GAS-scaled micro losses, as DeepSpeed's train_loss); NaN before the first step.
  double last_loss() const;

  torch::nn::Module& module();
  // Where the model, gradients and ZeRO partitions live (InitializeArgs.device).
  c10::Device device() const { return device_; }
  const Config& config() const;
  comm::CommunicatorPtr communicator() const;
  std::shared_ptr<torch::optim::Optimizer> optimizer() const;
  std::shared_ptr<LRScheduler> lr_scheduler() const;
  // The loader over InitializeArgs.training_data (DeepSpeed's engine.training_dataloader);
  // nullptr when no training data was given.
  std::shared_ptr<DataLoader> training_dataloader() const;
  MemoryReport memory_report() const;
  // The monitors of the config's tensorboard / csv_monitor blocks (DeepSpeed's engine.monitor):
  // write your own events through it. Never null; disabled on ranks that do not write.
  std::shared_ptr<monitor::Monitor> monitor() const;
  // DeepSpeed's deepspeed.comm.log_summary(): per collective kind and message size, the count,
  // total and average latency and the algorithmic and bus bandwidth of this rank's collectives
  // since the engine was built. Printed on the job's reporting rank (global rank 0; a pipeline's
  // last stage) and returned (on every rank).
  // Empty unless comms_logger.enabled. Not collective. Also printed when the engine is destroyed.
  std::string comms_summary() const;
  // DeepSpeed's see_memory_usage(message, force), with this rank's model states: the message,
  // the device's allocated/peak figures (GPU), the machine's used memory, the model states by kind
  // (memory_report(), in MB) and the process's RSS and peak RSS. Printed on the reporting rank
  // (which then resets the GPU peaks, as DeepSpeed) and returned (on every rank); nothing when
  // !force, as DeepSpeed. Not collective.
  std::string see_memory_usage(const std::string& message, bool force = true) const;

  // ---- checkpoints (docs/checkpoints.md) ----
  // Writes <save_dir>/<tag>/ (tag default "global_step<N>"): rank 0 the module and engine state,
  // every rank its share of the fp32 masters and optimizer moments, then rank 0 the manifest and,
  // with save_latest, <save_dir>/latest. Crash-safe: a save that fails or is killed leaves the
  // previous checkpoint and `latest` as they were. Throws CheckpointError (on every rank) when a
  // rank could not write. Returns true. COLLECTIVE.
  bool save_checkpoint(const std::string& save_dir, const std::string& tag = "",
                       const nlohmann::json& client_state = nlohmann::json::object(),
                       bool save_latest = true);
  // Loads <load_dir>/<tag> (tag default: the content of <load_dir>/latest; none there: returns an
  // empty result and warns, as DeepSpeed does). The checkpoint may come from another world size
  // or ZeRO stage (Adam moments are resharded). Verifies sizes and checksums first and throws
  // CheckpointError naming the file at fault, before anything is changed. COLLECTIVE.
  LoadedCheckpoint load_checkpoint(const std::string& load_dir, const std::string& tag = "",
                                   bool load_module_strict = true, bool load_optimizer_states = true,
                                   bool load_lr_scheduler_states = true,
                                   bool load_module_only = false);
  // DeepSpeed's save_16bit_model: the module's parameters as it trains them (16-bit under
  // bf16/fp16, else fp32) and its buffers, whole, in one file <save_dir>/<save_filename>, written
  // atomically by global rank 0 (the folder created): a torch.save state dict as DeepSpeed's
  // (pytorch_model.bin by default; Python's torch.load reads it), or safetensors for a name
  // ending in ".safetensors". Stage 3 gathers one unit at a time into it, and only when
  // zero_optimization.stage3_gather_16bit_weights_on_model_save is true: otherwise it warns,
  // writes nothing and returns false, as DeepSpeed does. A tied parameter is written under each of
  // its names; exclude_frozen_parameters leaves out those with requires_grad false. Throws
  // CheckpointError (on every rank) when the file could not be written, for a name that names no
  // file, for a pipeline or tensor-parallel engine (save_checkpoint, then ds_to_fp32), and inside
  // a gathered_parameters scope (as save_checkpoint). Returns true.
  // COLLECTIVE.
  bool save_16bit_model(const std::string& save_dir,
                        const std::string& save_filename = "pytorch_model.bin",
                        bool exclude_frozen_parameters = false);
  // ZeRO-3 whole-model access: the full parameters of `modules` (all when empty) are gathered and
  // writable on every rank until the scope ends; then, if modifier_rank is set, that rank's
  // values are broadcast into every rank's partitions (otherwise edits are dropped). COLLECTIVE.
  [[nodiscard]] GatheredParameters gathered_parameters(std::optional<int> modifier_rank = std::nullopt);
  [[nodiscard]] GatheredParameters gathered_parameters(
      const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
      std::optional<int> modifier_rank = std::nullopt);
  // Full parameters and buffers by name (module().named_parameters() then named_buffers()), as
  // copies, on rank 0; empty on other ranks. Gathers one unit at a time, so the peak per rank is
  // the largest unit (plus the root unit), not the model. COLLECTIVE. (save_16bit_model streams
  // the same gathers into its file instead, holding no copy.)
  std::vector<std::pair<std::string, at::Tensor>> consolidated_state_dict();

 protected:
  explicit Engine(EngineStatePtr state);
  // One engine call that may issue collectives (forward, backward, step, a pipeline batch, a
  // checkpoint, a gather or the end of its scope), for the job's failure board
  // (src/comm/failure_board.h). The outermost scope first settles a failure this rank posted
  // before (it throws CommError when the ranks stopped at different collectives, or when this
  // rank's job cannot continue). failed(), in a catch block, posts the failure in flight, if the
  // call had issued (or tried to issue) collectives: a peer waiting for one this rank will not
  // issue then fails at once instead of at the timeout.
  // `peers_wait_at_once`: other ranks are already blocked on this call's first transfer (a
  // pipeline batch: the next stage waits for this one's activations), so a failure before it
  // issued anything posts too, and they fail at once instead of at the timeout. (A fail-fast
  // choice: a retry on this rank alone could still have met them. When every rank fails alike,
  // settle finds them in agreement and a retry goes on.)
  class CallScope {
   public:
    CallScope(Engine& engine, const char* call, bool peers_wait_at_once = false);
    ~CallScope();
    CallScope(const CallScope&) = delete;
    CallScope& operator=(const CallScope&) = delete;
    void failed() noexcept;

   private:
    EngineState& state_;
    const char* call_;
    bool peers_wait_at_once_ = false;
    bool outermost_ = false;
    bool posted_ = false;
    uint64_t numbered_ = 0;  // the board's count at the start
    int posts_ = 0;
  };
  // Runs `body` as the engine call `call`: inside its CallScope, posting what escapes it.
  template <class Body>
  decltype(auto) in_call(const char* call, Body&& body, bool peers_wait_at_once = false) {
    CallScope scope(*this, call, peers_wait_at_once);
    try {
      return body();
    } catch (...) {
      scope.failed();
      throw;
    }
  }
  void before_forward();
  void after_forward();
  // The bodies of backward(), step() and consolidated_state_dict(), inside their CallScope.
  at::Tensor backward_in(const at::Tensor& loss);
  void step_in();
  std::vector<std::pair<std::string, at::Tensor>> consolidated_state_dict_in();
  // Rethrows a libtorch error raised in `phase` (forward, backward, step) as deepspeed::Error:
  // "rank R, <phase>: <what_without_backtrace()>". An out-of-memory in words (what was being
  // allocated, the bytes asked, what to try). With fp16 on a CPU operator that has no Half
  // kernel, a ConfigError naming fp16.enabled and suggesting bf16 instead.
  [[noreturn]] void report_torch_error(const char* phase, const c10::Error& error) const;
  // The same error, made but not thrown.
  std::exception_ptr translate_torch_error(const char* phase, const c10::Error& error) const;
  // Inside a catch block: runs `clean_up` (which must not throw), then rethrows what was caught,
  // a libtorch error as report_torch_error words it. The words come first, so that an
  // out-of-memory report says what the failed pass held before the clean-up frees it. Before
  // both, the open CallScope posts the failure: the clean-up waits for the failed pass's
  // collectives, and a peer blocked in one this rank did not issue must learn first.
  [[noreturn]] void rethrow_after_clean_up(const char* phase,
                                           const std::function<void()>& clean_up) const;
  // fp16.auto_cast: floating-point tensor arguments of forward() are cast to fp16 (others pass).
  bool auto_cast_inputs() const { return auto_cast_inputs_; }
  template <class T>
  decltype(auto) cast_input(T&& arg) const {
    if constexpr (std::is_same_v<std::decay_t<T>, at::Tensor>) {
      // Tensor arguments follow the model to its device (a batch from the DataLoader is on the
      // host), as DeepSpeed users do with .to(engine.device). Non-blocking: from pageable memory
      // the driver has staged the batch when the copy returns, and a blocking copy would make
      // the host wait for the GPU to finish the previous step before queueing this forward.
      at::Tensor t = arg.defined() && arg.device() != device_
                         ? arg.to(device_, /*non_blocking=*/true)
                         : at::Tensor(arg);
      if (auto_cast_inputs_ && t.is_floating_point()) return at::Tensor(t.to(at::kHalf));
      return t;
    } else {
      return std::forward<T>(arg);
    }
  }

 private:
  // The library reaches the state through detail::EngineAccess (src/runtime/engine_state.h):
  // internals kept off this header, so user programs compiled against it are not broken by
  // every change to them.
  friend struct detail::EngineAccess;
  EngineStatePtr state_;
  bool auto_cast_inputs_ = false;
  c10::Device device_ = c10::kCPU;
};

// The engine typed by the user's module so forward() can call the module's own forward.
template <class Module>
class ModelEngine : public Engine {
 public:
  ModelEngine(std::shared_ptr<Module> model, EngineStatePtr state)
      : Engine(std::move(state)), model_(std::move(model)) {}

  // A libtorch error inside the model's forward is rethrown as deepspeed::Error naming the rank
  // and the phase, with libtorch's message but not its C++ stack frames (report_torch_error).
  template <class... Args>
  auto forward(Args&&... args) {
    CallScope call(*this, "forward");
    try {
      before_forward();  // stage 3 prefetches its first units here (collectives)
      auto out = model_->forward(cast_input(std::forward<Args>(args))...);
      after_forward();
      return out;
    } catch (const c10::Error& e) {
      call.failed();
      report_torch_error("forward", e);
    } catch (...) {
      call.failed();
      throw;
    }
  }
  template <class... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }
  std::shared_ptr<Module> model() const { return model_; }

 private:
  std::shared_ptr<Module> model_;
};

// One of DeepSpeed's parameter-group dicts ({"params": [...], "weight_decay": 0.0}) for the
// optimizer built from the config's "optimizer" block: `options` overrides that block's "params"
// for these tensors only.
struct ParamGroup {
  std::vector<at::Tensor> params;
  nlohmann::json options = nlohmann::json::object();
};

template <class Module>
struct InitializeArgs {
  std::shared_ptr<Module> model;  // required
  std::string config;             // path to ds_config.json (or use config_json)
  nlohmann::json config_json;     // used when `config` is empty
  std::shared_ptr<Dataset> training_data;  // optional: builds the returned DataLoader
  // Optional client optimizer; overrides the config's "optimizer" block. At stage 0 in fp32 it is
  // used as it is. At stages 1-3 and with fp16/bf16 its parameter groups must together hold every
  // trainable parameter once: each group's options are kept and its parameters replaced by its
  // part of the rank's fp32 partition (several groups are taken, except for Lamb and the 1-bit
  // optimizers, which take one). Under offload_optimizer an Adam/AdamW runs as the CPU Adam with
  // each group's options, other types are refused (zero_force_ds_cpu_optimizer); where several
  // groups are taken with offload: docs/config.md. The optimizer initialize() returns is the one
  // that steps. Neither this nor an "optimizer" block: an engine for evaluation (DeepSpeed's
  // optimizer None): initialize() returns a null optimizer and no scheduler, forward works at every
  // stage (stage 3 still partitions and gathers), no gradient or optimizer state is allocated,
  // and backward()/step() throw deepspeed::Error.
  std::shared_ptr<torch::optim::Optimizer> optimizer;
  // DeepSpeed's `model_parameters` as parameter groups for the optimizer the config's "optimizer"
  // block builds. Empty (the default): one group of every trainable parameter. Otherwise every
  // trainable parameter must be in exactly one group and nothing else in any (else ConfigError
  // naming the group index). A group's `options` override the block's "params" for its tensors;
  // a group may set the keys its type keeps per group (Adam/AdamW, Lamb, the 1-bit types: lr,
  // betas, eps, weight_decay; SGD: lr, momentum, dampening, weight_decay, nesterov; Adagrad: lr,
  // lr_decay, weight_decay, eps, initial_accumulator_value), any other key is a ConfigError
  // naming the key, the group index and the type. A config "scheduler" writes every group's lr,
  // as DeepSpeed's do: WarmupCosineLR scales each group's own lr, the others replace it. Several
  // groups have a client optimizer's limits (not Lamb or the 1-bit types; with offload_optimizer
  // see docs/config.md). Refused (ConfigError) with a client `optimizer`, which DeepSpeed would
  // step ignoring these groups, and without an "optimizer" block.
  std::vector<ParamGroup> model_parameters;
  // Optional client scheduler factory; overrides the config's "scheduler" block.
  std::function<std::shared_ptr<LRScheduler>(std::shared_ptr<torch::optim::Optimizer>)> lr_scheduler;
  // Default: the world from init_distributed(); else, when the launcher's environment says this
  // process is one of several (dsrun/torchrun WORLD_SIZE > 1, OpenMPI, Slurm), initialize() calls
  // init_distributed() itself, as DeepSpeed does (rank 0 prints a line saying so); else a single
  // process.
  comm::CommunicatorPtr comm;
  // The trainer's values (batch sizes, learning rate, betas, eps, weight decay, clipping,
  // fp16/bf16, warm-up and total steps, hidden size): fill "auto" keys by Hugging Face's rules.
  ConfigOverrides overrides;
  // "auto" (default: DS_DEVICE, else this rank's GPU when there is one, else the CPU), "cpu",
  // "cuda", "cuda:N" (deepspeed/device.h). The model is moved there by initialize().
  std::string device = "auto";
  // Tensor parallelism (DeepSpeed's `mpu`): the grid the model's deepspeed::tp layers were built
  // on (their communicator is topology->tensor_parallel()). Gradients are then reduced and the
  // batch counted over topology->data_parallel() only, and the clipping norm counts a split
  // parameter's pieces once each and a replicated parameter once. Null: no tensor parallelism
  // (the data-parallel group is `comm`). REQUIRES: pipe size 1, `comm` unset or
  // topology->world(), every split layer on topology->tensor_parallel() (else ConfigError naming
  // the layer; a model with split layers and no topology is refused too), and not ZeRO-3 with
  // offload_optimizer on nvme.
  std::shared_ptr<comm::Topology> topology;
};

template <class Module>
struct InitializeResult {
  std::shared_ptr<ModelEngine<Module>> engine;
  std::shared_ptr<torch::optim::Optimizer> optimizer;
  std::shared_ptr<DataLoader> training_dataloader;
  std::shared_ptr<LRScheduler> lr_scheduler;
};

namespace detail {
struct BuildInput {
  std::shared_ptr<torch::nn::Module> module;
  std::string config_path;
  nlohmann::json config_json;
  std::shared_ptr<Dataset> training_data;
  std::shared_ptr<torch::optim::Optimizer> optimizer;
  std::function<std::shared_ptr<LRScheduler>(std::shared_ptr<torch::optim::Optimizer>)> lr_scheduler;
  comm::CommunicatorPtr comm;
  ConfigOverrides overrides;
  std::string device = "auto";
  std::shared_ptr<comm::Topology> topology;
  std::vector<ParamGroup> model_parameters;  // InitializeArgs::model_parameters
  // A pipeline stage: its micro-batches before the last accumulate in the parameters' .grad, and
  // tied layers are summed there between stages, so stages 0/1 keep .grad as views of their
  // gradient buffer, in the parameters' dtype (a wider grad_accum_dtype is not taken there).
  bool pipeline_stage = false;
  // Whether this rank prints the config's warnings (DeepSpeed logs config messages on global rank
  // 0). Unset: rank 0 of the topology's world, else of `comm`; a pipeline stage's `comm` is its
  // data-parallel group, whose rank 0 is not the job's, so initialize_pipeline sets it.
  std::optional<bool> prints_config_warnings;
};
// Builds everything that does not depend on the module's type. COLLECTIVE (broadcasts weights).
EngineStatePtr build_engine_state(BuildInput input);
}  // namespace detail

// deepspeed.initialize(): returns {engine, optimizer, training_dataloader, lr_scheduler}.
// COLLECTIVE: every rank calls it; rank 0's initial parameters are broadcast to all.
template <class Module>
InitializeResult<Module> initialize(InitializeArgs<Module> args) {
  detail::BuildInput in{args.model,       args.config,       std::move(args.config_json),
                        args.training_data, args.optimizer,  args.lr_scheduler,
                        args.comm,        args.overrides,    args.device,
                        args.topology};
  in.model_parameters = std::move(args.model_parameters);
  auto state = detail::build_engine_state(std::move(in));
  auto engine = std::make_shared<ModelEngine<Module>>(args.model, std::move(state));
  return {engine, engine->optimizer(), engine->training_dataloader(), engine->lr_scheduler()};
}

}  // namespace deepspeed
