// initialize(): config → communicator → weights broadcast → optimizer → ZeRO stage → scheduler →
// data loader. Every choice (stage, optimizer) is made here once.
#include <torch/torch.h>

#include <functional>
#include <iostream>
#include <stdexcept>
#include <unordered_map>

#include "deepspeed/checkpointing.h"
#include "deepspeed/device.h"
#include "deepspeed/optimizer.h"
#include "comm/checked_communicator.h"
#include "comm/launch_world.h"
#include "config/json_reader.h"
#include "device/out_of_memory.h"
#include "monitor/training_monitor.h"
#include "runtime/dump_state.h"
#include "runtime/engine_state.h"
#include "runtime/module_placement.h"
#include "deepspeed/tp.h"
#include "tp/tp_stage.h"
#include "optim/config_groups.h"
#include "optim/fused_adam.h"
#include "optim/lamb.h"
#include "optim/onebit_adam.h"
#include "optim/onebit_lamb.h"
#include "optim/param_reader.h"
#include "optim/zero_one_adam.h"
#include "zero/client_optimizer.h"
#include "zero/data_parallel.h"
#include "zero/flat_stage.h"
#include "zero/frozen_parameters.h"
#include "zero/stage3/stage3.h"
#include "zero/stage_options.h"
#include "zero/tensor_facts.h"
#include "util/ascii.h"

namespace deepspeed {
namespace detail {
namespace {

// Without InitializeArgs.comm or init_distributed(), a launched job (WORLD_SIZE > 1) is joined
// here, as deepspeed.initialize() calls init_distributed (comm/launch_world.h).
comm::CommunicatorPtr choose_communicator(const BuildInput& in) {
  return comm::world_or_launch(
      "initialize()", in.comm,
      comm::init_options_for_config(in.config_path, in.config_json));
}

// The config's warnings are printed by one rank (`print`: global rank 0), as DeepSpeed logs its
// config messages on rank 0 only, not once per rank; an error (ConfigError) is thrown on every
// rank, and the warnings found before it are printed first.
Config read_config(const BuildInput& in, int world_size, bool print) {
  if (in.config_path.empty() && in.config_json.is_null())
    throw ConfigError("initialize(): no config given (set InitializeArgs.config to a ds_config.json "
                      "path, or InitializeArgs.config_json)");
  std::vector<std::string> warnings;
  const auto report = [&] {
    if (print)
      for (const std::string& w : warnings) config::print_warning(w);
  };
  try {
    Config config = in.config_path.empty()
                        ? parse_config(in.config_json, world_size, in.overrides, &warnings)
                        : load_config(in.config_path, world_size, in.overrides, &warnings);
    report();
    return config;
  } catch (...) {
    report();
    throw;
  }
}

// The engine's device, checked against the communicator: NCCL moves only GPU tensors.
c10::Device choose_device(const std::string& requested, comm::Communicator& comm) {
  const c10::Device device = resolve_device(requested, comm.local_rank());
  if (comm.backend() == "nccl" && !device.is_cuda())
    throw ConfigError("device \"" + device.str() + "\": the communicator is NCCL, which moves GPU "
                      "tensors only; train on \"cuda\" or initialise with the gloo backend "
                      "(DS_COMM_BACKEND=gloo)");
  use_device(device);
  return device;
}

// Every rank starts from rank 0's weights (and buffers), as DeepSpeed does.
void broadcast_from_rank0(torch::nn::Module& module, comm::Communicator& comm) {
  if (comm.world_size() == 1) return;
  torch::NoGradGuard no_grad;
  for (auto& p : module.parameters()) comm.broadcast(p, 0)->wait();
  for (auto& b : module.buffers()) comm.broadcast(b, 0)->wait();
}

// Adam/AdamW run the vectorised FusedAdam on every stage (as DeepSpeed uses FusedAdam); Lamb and
// the 1-bit family are the project's own (the 1-bit ones average their momentum over `comm`, the
// data-parallel group); other types come from libtorch through make_optimizer.
optim::BlockOptimizer block_optimizer(comm::CommunicatorPtr comm) {
  return [comm](const OptimizerConfig& block,
                std::vector<at::Tensor> params) -> std::shared_ptr<torch::optim::Optimizer> {
    auto type = canonical_optimizer_type(block.type);
    if (type == "Adam" || type == "AdamW")
      return std::make_shared<optim::FusedAdam>(std::move(params), parse_adam_params(block));
    if (type == "Lamb")
      return std::make_shared<optim::Lamb>(std::move(params), optim::parse_lamb_params(block));
    if (type == "OneBitAdam")
      return std::make_shared<optim::OneBitAdam>(
          std::move(params), optim::parse_onebit_adam_params(block), comm);
    if (type == "ZeroOneAdam")
      return std::make_shared<optim::ZeroOneAdam>(
          std::move(params), optim::parse_zero_one_adam_params(block), comm);
    if (type == "OneBitLamb")
      return std::make_shared<optim::OneBitLamb>(
          std::move(params), optim::parse_onebit_lamb_params(block), comm);
    return make_optimizer(block, std::move(params));
  };
}

// InitializeArgs.model_parameters (`groups`, null when empty): a ZeRO partition (`params`, one
// tensor) goes to group 0 and the shard gives each group its part (zero/flat_groups.h).
zero::OptimizerFactory optimizer_factory(const Config& config, comm::CommunicatorPtr comm,
                                         std::shared_ptr<const optim::ConfigGroups> groups) {
  return [config, comm, groups](std::vector<at::Tensor> params) {
    // build_stage() builds an engine without an optimizer before it asks for one.
    if (!config.optimizer) throw std::logic_error("optimizer_factory: no \"optimizer\" block");
    if (!groups) return block_optimizer(comm)(*config.optimizer, std::move(params));
    std::vector<std::vector<at::Tensor>> per_group(groups->count());
    per_group[0] = std::move(params);
    return optim::grouped_optimizer(*groups, std::move(per_group), block_optimizer(comm));
  };
}

// Several groups: the stage cuts its partition by them, as for a client optimizer's.
void describe_config_groups(const optim::ConfigGroups* groups, zero::ShardOptions& shard) {
  if (!groups || groups->count() < 2) return;
  shard.group_of = groups->group_of;
  shard.group_count = groups->count();
}

// fp16/bf16 training holds the model in 16 bits, as DeepSpeed's module.half()/bfloat16(): every
// floating-point parameter and buffer is converted once, before the weights are broadcast.
// Integer buffers (token ids, counters) keep their dtype.
c10::optional<at::ScalarType> model_dtype(const Config& config) {
  if (config.bf16.enabled) return torch::kBFloat16;
  if (config.fp16.enabled) return torch::kHalf;
  return c10::nullopt;
}

void cast_module(torch::nn::Module& module, at::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  for (auto& p : module.parameters())
    if (p.is_floating_point() && p.scalar_type() != dtype) p.set_data(p.to(dtype));
  for (auto& b : module.buffers())
    if (b.is_floating_point() && b.scalar_type() != dtype) b.set_data(b.to(dtype));
}

// data_types.grad_accum_dtype, where the micro-steps accumulate. Unset, DeepSpeed's default: the
// model's dtype, except bf16 without ZeRO, which accumulates in fp32 (its BF16_Optimizer). A
// dtype narrower than the parameters' (bf16 for an fp32 model) is refused: the fp32 update reads
// fp32 gradients.
std::string grad_accum_dtype(const Config& config, int stage, at::ScalarType param_dtype) {
  if (!config.grad_accum_dtype.empty()) {
    const auto dtype = zero::dtype_from_config(config.grad_accum_dtype, param_dtype);
    if (c10::elementSize(dtype) < c10::elementSize(param_dtype))
      throw ConfigError("data_types.grad_accum_dtype = \"" + config.grad_accum_dtype +
                        "\" is narrower than the model's " + c10::toString(param_dtype) +
                        " parameters; use fp32, or train in 16 bits (bf16/fp16.enabled)");
    return config.grad_accum_dtype;
  }
  return stage == 0 && config.bf16.enabled ? "fp32" : "";
}

zero::FlatStageOptions flat_stage_options(const Config& config, int stage,
                                          at::ScalarType param_dtype, bool pipeline_stage,
                                          bool print_warnings) {
  zero::FlatStageOptions o;
  o.param_dtype = param_dtype;
  o.partitioned = stage >= 1;
  o.accumulation_steps = config.gradient_accumulation_steps;
  o.grad_accum_dtype = grad_accum_dtype(config, stage, param_dtype);
  // Stage 1 reduce-scatters into its partition at the boundary (zero/flat_grad_reducer.h) unless
  // it needs the whole gradients: a pipeline sums tied layers' .grad between its stages after
  // the reduction, and an accumulation wider than the parameters needs a wider buffer for every
  // gradient between the micro-steps (DeepSpeed's BF16_Optimizer at stage 1). There it
  // all-reduces its full gradient buffer, as stage 0.
  const bool wider_accumulation =
      config.gradient_accumulation_steps > 1 &&
      zero::dtype_from_config(o.grad_accum_dtype, param_dtype) != param_dtype;
  o.scatter_gradients = stage >= 2 || (stage == 1 && !pipeline_stage && !wider_accumulation);
  o.scatter_every_micro_step = stage >= 2;
  const auto& offload = config.zero_optimization.offload_optimizer;
  if (print_warnings && stage == 1 && !o.scatter_gradients && offload.device == "cpu" &&
      offload.overlap_step.value_or(false) && !offload.pin_memory)
    std::fprintf(stderr,
                 "[deepspeed] warning: zero_optimization.offload_optimizer.overlap_step is true "
                 "but pin_memory is false: on a GPU, ZeRO stage 1 %s then runs the update after "
                 "backward (pageable copies would stall it); set pin_memory true\n",
                 pipeline_stage ? "in a pipeline" : "accumulating wider than its parameters");
  // A pipeline runs only its batch's last backward through the stage: the micro-batches before
  // it accumulate in the parameters' .grad (pipe/schedule_interpreter.cpp), and tied layers are
  // summed there between stages, at every ZeRO stage. Stages 0/1 keep .grad as views of their
  // buffer then; stage 2's partition gets one reduce-scatter per batch, so a wider partition
  // only keeps what a wider communication_data_type summed.
  if (pipeline_stage) {
    if (print_warnings &&
        zero::dtype_from_config(config.grad_accum_dtype, param_dtype) != param_dtype)
      std::fprintf(stderr,
                   "[deepspeed] warning: data_types.grad_accum_dtype = %s is not taken by a "
                   "pipeline at zero_optimization.stage %d: its micro-batches accumulate in the "
                   "parameters' dtype\n",
                   config.grad_accum_dtype.c_str(), stage);
    if (!o.scatter_gradients ||
        zero::dtype_from_config(config.communication_data_type, param_dtype) == param_dtype)
      o.grad_accum_dtype.clear();
  }
  o.allgather_bucket_numel = config.zero_optimization.allgather_bucket_size;
  // A pipeline's stages run their forwards from its schedule, not through Engine::forward.
  o.overlap_param_gather = config.zero_optimization.overlap_param_gather && !pipeline_stage;
  if (print_warnings && config.zero_optimization.overlap_param_gather && pipeline_stage)
    std::fprintf(stderr,
                 "[deepspeed] warning: zero_optimization.overlap_param_gather is ignored in a "
                 "pipeline: the all-gather after the step is waited for there\n");
  o.reduction = zero::reduction_options(config);
  o.shard = zero::shard_options(config);
  // A pipeline's stages run their forwards by its schedule, not through Engine::forward.
  if (pipeline_stage) o.shard.overlap_forward = false;
  return o;
}

zero::Stage3Options stage3_options(const Config& config, at::ScalarType param_dtype) {
  zero::Stage3Options o;
  o.param_dtype = param_dtype;
  o.grad_accum_dtype = grad_accum_dtype(config, 3, param_dtype);
  o.zero = config.zero_optimization;
  o.aio = config.aio;
  o.reduction = zero::reduction_options(config);
  o.shard = zero::shard_options(config);
  o.shard.overlap_forward = false;  // stages 1 and 2 only (zero/forward_waits.h)
  return o;
}

// No "optimizer" block and no client optimizer: an engine for evaluation (DeepSpeed's optimizer
// None, e.g. DeepSpeed-Chat's ZeRO-3 reference model). Nothing for training is allocated: stages
// 0-2 leave the module's parameters as they are (whole on every rank, in the model's dtype);
// stage 3 partitions them and gathers each unit for forward (DeepSpeed's parameter-only
// DeepSpeedZeRoOffload) with no masters, moments or gradient partition
// (zero/no_optimizer_shard.h). s.optimizer stays null; engine.cpp refuses backward() and step().
void build_stage_without_optimizer(EngineState& s) {
  const int stage = s.config.zero_optimization.stage;
  const zero::StageContext context{s.comm, s.device};
  if (stage == 3) {
    const auto dtype = zero::uniform_param_dtype(stage, s.trainable);
    s.stage = std::make_unique<zero::Stage3>(*s.module, s.trainable, context,
                                             stage3_options(s.config, dtype),
                                             zero::OptimizerFactory());
    return;
  }
  const zero::DataParallelOptions options{zero::reduction_options(s.config)};
  s.stage = std::make_unique<zero::DataParallelStage>(s.trainable, context, options, nullptr);
}

// The stage is chosen once, here, as a composition of a parameter part, a gradient-reduction
// part and a shard optimizer (docs/architecture.md):
//   stage 0, fp32     DataParallelStage: the optimizer steps the module's own parameters
//   stage 0, 16-bit   FlatStage: replicated partition, all-reduce at the boundary
//   stage 1           FlatStage: sharded partitions,   reduce-scatter at the boundary (all-reduce
//                     in a pipeline or accumulating wider than the parameters)
//   stage 2           FlatStage: sharded partitions,   reduce-scatter every micro-step
//   stage 3           Stage3: per-unit slices gathered and released, reduce-scatter per unit
// A client optimizer steps the module's parameters at stage 0 in fp32; elsewhere the shard
// optimizer builds it over the fp32 partition (zero/client_optimizer.h).
void build_stage(EngineState& s, std::shared_ptr<torch::optim::Optimizer> client_optimizer,
                 std::shared_ptr<const optim::ConfigGroups> groups, bool pipeline_stage,
                 bool print_warnings) {
  const int stage = s.config.zero_optimization.stage;
  const bool mixed = model_dtype(s.config).has_value();
  const zero::StageContext context{s.comm, s.device};
  if (!client_optimizer && !s.config.optimizer) return build_stage_without_optimizer(s);
  if (stage < 1 && !mixed) {
    // (Accumulates in autograd's .grad; the key is only checked: nothing is wider than fp32.)
    grad_accum_dtype(s.config, stage,
                     s.trainable.empty() ? at::kFloat : s.trainable.front().scalar_type());
    if (client_optimizer)
      s.optimizer = client_optimizer;
    else if (groups)  // the module's own parameters, group by group
      s.optimizer = optim::grouped_optimizer(*groups, optim::split_by_group(s.trainable, *groups),
                                             block_optimizer(s.comm));
    else
      s.optimizer = optimizer_factory(s.config, s.comm, nullptr)(s.trainable);
    const zero::DataParallelOptions options{zero::reduction_options(s.config)};
    s.stage = std::make_unique<zero::DataParallelStage>(s.trainable, context, options, s.optimizer);
    return;
  }
  const zero::OptimizerFactory make_optimizer =
      client_optimizer ? zero::client_optimizer_factory(client_optimizer, s.trainable,
                                                        zero::client_optimizer_options(s.config))
                       : optimizer_factory(s.config, s.comm, groups);
  switch (stage) {
    case 0:
    case 1:
    case 2: {
      const auto dtype = zero::uniform_param_dtype(stage, s.trainable);
      auto options = flat_stage_options(s.config, stage, dtype, pipeline_stage, print_warnings);
      zero::describe_client_groups(client_optimizer.get(), s.trainable, options.shard);
      describe_config_groups(groups.get(), options.shard);
      auto flat = std::make_unique<zero::FlatStage>(s.trainable, context, options,
                                                    make_optimizer, s.module.get());
      // The config's key, not options': a pipeline's options have it cleared already.
      if (s.config.zero_optimization.offload_optimizer.overlap_forward &&
          !flat->finishes_in_forward() && print_warnings)
        std::fprintf(stderr,
                     "[deepspeed] warning: zero_optimization.offload_optimizer.overlap_forward is "
                     "ignored here: it needs offload_optimizer.device \"cpu\" with FusedAdam "
                     "(Adam/AdamW) updating during backward (overlap_step, the default on a GPU; "
                     "no gradient_clipping, fp16 or bf16.check_grad_overflow), ZeRO stage 1 or 2, "
                     "one data-parallel rank and no pipeline\n");
      s.stage = std::move(flat);
      break;
    }
    case 3: {
      const auto dtype = zero::uniform_param_dtype(stage, s.trainable);
      auto options = stage3_options(s.config, dtype);
      zero::describe_client_groups(client_optimizer.get(), s.trainable, options.shard);
      describe_config_groups(groups.get(), options.shard);
      s.stage = std::make_unique<zero::Stage3>(*s.module, s.trainable, context, options,
                                               make_optimizer);
      break;
    }
    default:
      throw ConfigError("zero_optimization.stage = " + std::to_string(stage) +
                        " is not supported (0, 1, 2 or 3)");
  }
  s.optimizer = s.stage->optimizer();
}

// DeepSpeed's fp16 wrapper without ZeRO: FP16_Optimizer for its FusedAdam (Adam/AdamW unless
// params.torch_adam) and the 1-bit Adams, FP16_UnfusedOptimizer for any other optimizer (a
// client's included). Only their loss scalers' defaults differ here.
precision::Fp16Wrapper fp16_wrapper_for(const Config& config, bool client_optimizer) {
  if (config.zero_optimization.stage >= 1) return precision::Fp16Wrapper::kZero;
  if (client_optimizer || !config.optimizer) return precision::Fp16Wrapper::kUnfused;
  const std::string type = ascii_lower(config.optimizer->type);
  bool fused = type == "onebitadam" || type == "zerooneadam";
  if (type == "adam" || type == "adamw") {
    // Read as the optimizer factory reads it ("true", 1, ...): one rule, so both agree.
    optim::ParamReader params(config.optimizer->params, "optimizer.params");
    fused = !params.get_bool("torch_adam", false);
  }
  return fused ? precision::Fp16Wrapper::kFused : precision::Fp16Wrapper::kUnfused;
}

}  // namespace

// InitializeArgs.topology (tensor parallelism): checked against the rest of the arguments.
void check_topology(const comm::Topology& t, const comm::CommunicatorPtr& given) {
  if (t.grid().pipe_size() != 1)
    throw ConfigError("initialize(): InitializeArgs.topology has pipe size " +
                      std::to_string(t.grid().pipe_size()) +
                      "; pipeline parallelism goes through pipe::initialize_pipeline");
  if (given && given != t.world())
    throw ConfigError("initialize(): InitializeArgs.comm is not InitializeArgs.topology->world(); "
                      "give one of them");
}

// Tensor parallelism: the stage counts the norm of split parameters over the tensor group. Every
// ZeRO stage partitions each tensor rank's (already split) parameters over its data-parallel group.
void wrap_tensor_parallel(EngineState& s) {
  const int tensor = s.topology->grid().tensor_size();
  if (tensor == 1) return;
  s.stage = tp::tensor_parallel_stage(std::move(s.stage), s.topology->tensor_parallel(),
                                      tp::split_parameters(*s.module));
  // Every rank of a tensor group has the same loss and norm: its rank 0 alone prints and writes
  // the monitors (else tensor_size data-parallel rank 0s would write the same files).
  if (s.topology->tensor_parallel()->rank() != 0) s.log_steps = false;
}

EngineStatePtr build_engine_state(BuildInput in) {
  if (!in.module) throw ConfigError("initialize(): InitializeArgs.model is null");
  EngineStatePtr s(new EngineState());
  if (in.topology) check_topology(*in.topology, in.comm);
  comm::CommunicatorPtr world = in.topology ? in.topology->world() : choose_communicator(in);
  // The batch triple is per data-parallel rank; with pipe = tensor = 1 that is the world.
  const bool print_warnings = in.prints_config_warnings.value_or(world->rank() == 0);
  s->config = read_config(in, in.topology ? in.topology->grid().data_size() : world->world_size(),
                          print_warnings);
  // (A pipeline stage is checked by initialize_pipeline, which passes its topology apart.)
  if (!in.pipeline_stage) tp::check_initialize_args(*in.module, in.topology.get(), s->config);
  // DeepSpeed's users call deepspeed.checkpointing.configure(deepspeed_config=...) themselves;
  // here initialize() does it, so the config block alone takes effect. A tensor-parallel
  // topology is the model-parallel group partition_activations splits checkpoints over (set
  // first: configure() warns when partition_activations has no group).
  if (in.topology && in.topology->grid().tensor_size() > 1)
    checkpointing::set_model_parallel_group(in.topology->tensor_parallel());
  checkpointing::configure(s->config.activation_checkpointing);
  // The checker wraps the world before any group is split from it, so that every group is checked
  // (CheckedCommunicator::split wraps the groups it makes). A given topology's groups are split
  // already: its world must have been wrapped before (a pipeline stage's data-parallel group was,
  // by initialize_pipeline: with_comms_check returns a checked one as it is).
  if (s->config.comms_check || comm::comms_check_from_env()) {
    if (in.topology)
      comm::require_checked_topology(*in.topology, "initialize(): InitializeArgs.topology",
                                     s->config.comms_check);
    else
      world = comm::with_comms_check(world);
  }
  // Gradients and the loss mean travel over the data-parallel group; with the default sizes it
  // is `world` itself.
  s->topology = in.topology ? in.topology : std::make_shared<comm::Topology>(world);
  s->comm = s->topology->data_parallel();
  s->module = in.module;
  s->device = choose_device(in.device, *s->comm);
  // Monitors first: a bad tensorboard/csv_monitor output_path fails before any real work.
  // Global rank 0 reports (a pipeline stage's engine is told its part by initialize_pipeline).
  s->monitor = std::make_shared<monitor::TrainingMonitor>(s->config, s->comm, s->device,
                                                          s->topology->world()->rank() == 0);

  // An out-of-memory on the device is reported in words, naming what was being built.
  const auto reporting_oom = [&s](const char* where, const std::function<void()>& work) {
    forget_failed_allocation();
    try {
      work();
    } catch (const c10::Error& e) {
      if (auto oom = out_of_memory_message(e.what_without_backtrace(), where,
                                           s->config.zero_optimization.stage, s->device,
                                           take_failed_allocation()))
        throw Error(*oom);
      throw;
    }
  };
  reporting_oom("initialize() moving the model to its device", [&] {
    if (auto dtype = model_dtype(s->config)) cast_module(*s->module, *dtype);
    // DeepSpeed moves the module to its device in initialize(); so do we (after the cast, so
    // the 32-bit copy never lands on the GPU), at stage 3 unit by unit (module_placement.h).
    move_module_to_device(*s->module, s->device, s->config.zero_optimization.stage);
  });
  // A tied parameter (embedding = head) appears once per name (libtorch does not deduplicate):
  // train it once, under its first name; the later names are its aliases.
  std::unordered_map<const void*, std::string> first_name;
  std::vector<at::Tensor> frozen;  // no stage's: counted in the memory report beside the stage
  for (auto& item : s->module->named_parameters()) {
    const auto [it, first] = first_name.emplace(item.value().unsafeGetTensorImpl(), item.key());
    if (!first) {
      s->shared_params.emplace_back(item.key(), it->second);
    } else if (item.value().requires_grad()) {
      s->trainable.push_back(item.value());
      s->trainable_names.push_back(item.key());
    } else {
      frozen.push_back(item.value());
    }
  }

  std::shared_ptr<const optim::ConfigGroups> groups;
  if (!in.model_parameters.empty())
    groups = std::make_shared<const optim::ConfigGroups>(optim::resolve_model_parameters(
        s->config, in.optimizer != nullptr, in.model_parameters, s->trainable,
        s->trainable_names));

  broadcast_from_rank0(*s->module, *s->comm);

  // Building a stage allocates its partitions, buckets and optimizer state on the device.
  reporting_oom("initialize() building the stage's partitions, buckets and optimizer state",
                [&] { build_stage(*s, in.optimizer, groups, in.pipeline_stage, print_warnings); });
  s->stage = zero::counting_frozen_parameters(std::move(s->stage), std::move(frozen));
  wrap_tensor_parallel(*s);
  // A ZeRO key: stage 0 (DeepSpeed's engine without its ZeRO optimizer) takes no notice of it.
  if (!s->config.zero_optimization.ignore_unused_parameters &&
      s->config.zero_optimization.stage >= 1 && s->optimizer)
    s->unused_parameters =
        std::make_unique<UnusedParameterCheck>(s->trainable, s->trainable_names);
  s->loss_scaler = precision::make_loss_scaler(s->config.fp16,
                                               fp16_wrapper_for(s->config, in.optimizer != nullptr));

  // Without an optimizer there is nothing to schedule: DeepSpeed configures no scheduler then.
  if (s->optimizer && in.lr_scheduler) {
    s->scheduler = in.lr_scheduler(s->optimizer);
  } else if (s->optimizer && s->config.scheduler) {
    s->scheduler = make_lr_scheduler(*s->config.scheduler, lr_target_for(s->optimizer));
  }
  s->training_data = in.training_data;
  if (s->training_data) {
    try {
      s->loader = std::make_shared<DataLoader>(
          s->training_data, s->config.train_micro_batch_size_per_gpu, s->comm->rank(),
          s->comm->world_size(), s->config.seed, /*shuffle=*/true, s->config.dataloader_drop_last);
    } catch (const ConfigError& e) {
      // The loader names its constructor's arguments; here they are config keys.
      throw ConfigError("initialize(): the loader of training_data "
                        "(train_micro_batch_size_per_gpu " +
                        std::to_string(s->config.train_micro_batch_size_per_gpu) +
                        ", dataloader_drop_last " +
                        (s->config.dataloader_drop_last ? "true" : "false") + "): " + e.what());
    }
  }
  const auto& grid = s->topology->grid();
  EngineState* raw = s.get();
  s->monitor->attach({s->module, [raw] { return raw->stage->memory(); }, grid.world_size(),
                      grid.data_size(), grid.tensor_size()});
  s->monitor->mark_comms_start();
  if (s->config.dump_state && world->rank() == 0) {
    std::cout << describe_engine_state(*s);  // one write: ranks sharing a terminal
    std::cout.flush();
  }
  return s;
}

}  // namespace detail
}  // namespace deepspeed
