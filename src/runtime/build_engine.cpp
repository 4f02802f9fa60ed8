// initialize(): config → communicator → weights broadcast → optimizer → ZeRO stage → scheduler →
// data loader. Every choice (stage, optimizer) is made here once.
#include <torch/torch.h>

#include <unordered_set>

#include "deepspeed/optimizer.h"
#include "runtime/engine_state.h"
#include "optim/fused_adam.h"
#include "zero/data_parallel.h"
#include "zero/partitioned_stage.h"
#include "zero/stage3/stage3.h"

namespace deepspeed {
namespace detail {
namespace {

comm::CommunicatorPtr choose_communicator(comm::CommunicatorPtr given) {
  if (given) return given;
  if (auto w = comm::world()) return w;
  return comm::make_single_process_communicator();
}

Config read_config(const BuildInput& in, int world_size) {
  if (!in.config_path.empty()) return load_config(in.config_path, world_size, in.overrides);
  if (in.config_json.is_null())
    throw ConfigError("initialize(): no config given (set InitializeArgs.config to a ds_config.json "
                      "path, or InitializeArgs.config_json)");
  return parse_config(in.config_json, world_size, in.overrides);
}

// Every rank starts from rank 0's weights (and buffers), as DeepSpeed does.
void broadcast_from_rank0(torch::nn::Module& module, comm::Communicator& comm) {
  if (comm.world_size() == 1) return;
  torch::NoGradGuard no_grad;
  for (auto& p : module.parameters()) comm.broadcast(p, 0)->wait();
  for (auto& b : module.buffers()) comm.broadcast(b, 0)->wait();
}

// Adam/AdamW run the vectorised FusedAdam on every stage (as DeepSpeed uses FusedAdam); other
// types come from libtorch through make_optimizer.
zero::OptimizerFactory optimizer_factory(const Config& config) {
  return [config](std::vector<at::Tensor> params) -> std::shared_ptr<torch::optim::Optimizer> {
    if (!config.optimizer)
      throw ConfigError("initialize(): no optimizer: add an \"optimizer\" block to the config or "
                        "pass InitializeArgs.optimizer");
    auto type = canonical_optimizer_type(config.optimizer->type);
    if (type == "Adam" || type == "AdamW")
      return std::make_shared<optim::FusedAdam>(std::move(params),
                                                parse_adam_params(*config.optimizer));
    return make_optimizer(*config.optimizer, std::move(params));
  };
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

// The stage is chosen once, here.
void build_stage(EngineState& s, std::shared_ptr<torch::optim::Optimizer> client_optimizer) {
  const int stage = s.config.zero_optimization.stage;
  const bool mixed = model_dtype(s.config).has_value();
  if (mixed && client_optimizer)
    throw ConfigError(std::string(s.config.bf16.enabled ? "bf16" : "fp16") +
                      ".enabled: a client optimizer (InitializeArgs.optimizer) cannot be used with "
                      "16-bit training, which keeps its own fp32 master weights; give the optimizer "
                      "in the config's \"optimizer\" block instead");
  if (stage == 0 && !mixed) {
    s.optimizer = client_optimizer ? client_optimizer : optimizer_factory(s.config)(s.trainable);
    s.stage = std::make_unique<zero::DataParallelStage>(s.trainable, s.comm, s.config, s.optimizer);
    return;
  }
  if (client_optimizer)
    throw ConfigError("zero_optimization.stage = " + std::to_string(stage) +
                      ": a client optimizer (InitializeArgs.optimizer) works with stage 0 only; "
                      "give the optimizer in the config's \"optimizer\" block instead");
  if (stage <= 2) {
    s.stage = std::make_unique<zero::PartitionedStage>(stage, s.trainable, s.comm, s.config,
                                                       optimizer_factory(s.config));
    s.optimizer = s.stage->optimizer();
    return;
  }
  if (stage == 3) {
    s.stage = std::make_unique<zero::Stage3>(*s.module, s.trainable, s.comm, s.config,
                                             optimizer_factory(s.config));
    s.optimizer = s.stage->optimizer();
    return;
  }
  throw ConfigError("zero_optimization.stage = " + std::to_string(stage) +
                    " is not supported (0, 1, 2 or 3)");
}

}  // namespace

EngineStatePtr build_engine_state(BuildInput in) {
  if (!in.module) throw ConfigError("initialize(): InitializeArgs.model is null");
  EngineStatePtr s(new EngineState());
  comm::CommunicatorPtr world = choose_communicator(in.comm);
  // The batch triple is per data-parallel rank; with pipe = tensor = 1 that is the world.
  s->config = read_config(in, world->world_size());
  if (s->config.comms_check || comm::comms_check_from_env()) world = comm::with_comms_check(world);
  // Gradients and the loss mean travel over the data-parallel group; with the default sizes it
  // is `world` itself.
  s->topology = std::make_shared<comm::Topology>(world);
  s->comm = s->topology->data_parallel();
  s->module = in.module;

  if (auto dtype = model_dtype(s->config)) cast_module(*s->module, *dtype);
  // A tied parameter (embedding = head) appears once per name: train it once.
  std::unordered_set<const void*> seen;
  for (auto& p : s->module->parameters())
    if (p.requires_grad() && seen.insert(p.unsafeGetTensorImpl()).second) s->trainable.push_back(p);

  broadcast_from_rank0(*s->module, *s->comm);

  build_stage(*s, in.optimizer);
  s->loss_scaler =
      precision::make_loss_scaler(s->config.fp16, s->config.zero_optimization.stage >= 1);

  if (in.lr_scheduler) {
    s->scheduler = in.lr_scheduler(s->optimizer);
  } else if (s->config.scheduler) {
    s->scheduler = make_lr_scheduler(*s->config.scheduler, lr_target_for(s->optimizer));
  }
  s->training_data = in.training_data;
  if (s->training_data) {
    s->loader = std::make_shared<DataLoader>(
        s->training_data, s->config.train_micro_batch_size_per_gpu, s->comm->rank(),
        s->comm->world_size(), s->config.seed, /*shuffle=*/true, /*drop_last=*/true);
  }
  return s;
}

std::shared_ptr<DataLoader> engine_data_loader(EngineState& state) { return state.loader; }

}  // namespace detail
}  // namespace deepspeed
