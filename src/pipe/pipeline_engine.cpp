// initialize_pipeline() and PipelineEngine: the stage's Engine (ZeRO 0-2 over its data-parallel
// group) driven by the 1F1B schedule, with activations and gradients sent point to point over
// the pipe group.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <regex>
#include <set>

#include "deepspeed/checkpointing.h"
#include "deepspeed/topology.h"
#include "deepspeed/tp.h"
#include "pipe/pipe_stage.h"
#include "pipe/stage_module.h"
#include "runtime/engine_state.h"
#include "tp/tp_stage.h"

namespace deepspeed {
namespace pipe {

struct TiedGroup {
  std::string key;
  comm::CommunicatorPtr comm;  // the holders of the key with this rank's data and tensor
                               // coordinates
  std::vector<at::Tensor> params;
};

struct PipelineRuntime {
  PipelineModule spec;
  std::shared_ptr<comm::Topology> topology;
  comm::CommunicatorPtr pipe;  // numbered by stage
  int stage = 0;
  int stages = 1;
  Partition partition;
  StageModule module{nullptr};
  std::vector<TiedGroup> tied;
  bool dynamic_shape = false;
  // Shape metadata: sent / received once unless dynamic_shape.
  bool sent_meta = false;
  bool have_recv_meta = false;
  std::vector<int64_t> recv_shape;
  at::ScalarType recv_dtype = at::kFloat;
  int held = 0;
  int max_held = 0;
  PipelineEngine::BatchTiming timing;
};

namespace {

// Metadata message: [ndim, dtype, dims...] padded to a fixed length, so the receiver knows its
// size without a first message.
constexpr int64_t kMetaLen = 10;

void send_meta(comm::Communicator& c, const at::Tensor& t, int dst) {
  TORCH_CHECK(t.dim() <= kMetaLen - 2, "pipeline: activations of more than ", kMetaLen - 2,
              " dimensions are not supported, got ", t.sizes());
  at::Tensor meta = torch::zeros({kMetaLen}, torch::kLong);
  meta[0] = t.dim();
  meta[1] = static_cast<int64_t>(t.scalar_type());
  for (int64_t i = 0; i < t.dim(); ++i) meta[2 + i] = t.size(i);
  c.send(meta, dst)->wait();
}

void recv_meta(comm::Communicator& c, int src, std::vector<int64_t>& shape, at::ScalarType& dtype) {
  at::Tensor meta = torch::zeros({kMetaLen}, torch::kLong);
  c.recv(meta, src)->wait();
  const int64_t ndim = meta[0].item<int64_t>();
  dtype = static_cast<at::ScalarType>(meta[1].item<int64_t>());
  shape.clear();
  for (int64_t i = 0; i < ndim; ++i) shape.push_back(meta[2 + i].item<int64_t>());
}

int64_t trainable_numel(const torch::nn::AnyModule& m) {
  if (m.is_empty()) return 0;
  int64_t n = 0;
  for (auto& p : m.ptr()->parameters())
    if (p.requires_grad()) n += p.numel();
  return n;
}

// The stage count: the module's, else the config's pipeline.stages (a number).
int stage_count(const PipelineModule& model, const nlohmann::json& cfg) {
  if (model.num_stages > 0) return model.num_stages;
  if (cfg.contains("pipeline") && cfg["pipeline"].contains("stages")) {
    const auto& v = cfg["pipeline"]["stages"];
    if (v.is_number_integer() && v.get<int64_t>() >= 1) return static_cast<int>(v.get<int64_t>());
    if (!(v.is_string() && v.get<std::string>() == "auto"))
      throw ConfigError("pipeline.stages = " + v.dump() + ": expected a positive number of stages");
  }
  throw ConfigError("pipeline.stages: give the number of stages in the config (\"pipeline\": "
                    "{\"stages\": N}) or in PipelineModule.num_stages");
}

nlohmann::json read_json(const PipelineInitializeArgs& args) {
  if (args.config.empty()) return args.config_json;
  std::ifstream in(args.config);
  if (!in) throw ConfigError("initialize_pipeline(): cannot read config file " + args.config);
  try {
    return nlohmann::json::parse(in, nullptr, true, /*ignore_comments=*/true);
  } catch (const std::exception& e) {
    throw ConfigError("initialize_pipeline(): " + args.config + ": " + e.what());
  }
}

// Per-layer weights for the partition method, and the layers built to count them.
std::vector<int64_t> layer_weights(const std::vector<LayerSpec>& specs, const std::string& method,
                                   uint64_t seed, std::map<size_t, torch::nn::AnyModule>& built) {
  std::vector<int64_t> w(specs.size(), 1);
  if (method == "uniform") return w;
  const bool by_type = method.rfind("type:", 0) == 0;
  if (!by_type && method != "parameters")
    throw ConfigError("pipeline.partition = \"" + method +
                      "\": expected \"parameters\", \"uniform\" or \"type:<regex>\"");
  std::regex pattern;
  if (by_type) {
    try {
      pattern = std::regex(method.substr(5), std::regex::icase);
    } catch (const std::regex_error& e) {
      throw ConfigError("pipeline.partition = \"" + method + "\": bad regular expression: " + e.what());
    }
  }
  std::map<std::string, size_t> first_of_key;
  bool matched = false;
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& key = specs[i].tied_key;
    torch::nn::AnyModule m;
    if (!key.empty() && first_of_key.count(key))
      m = built[first_of_key[key]];
    else
      m = build_layer(specs, i, seed);
    if (!key.empty()) first_of_key.emplace(key, i);
    built[i] = m;
    if (by_type) {
      w[i] = std::regex_search(layer_type_name(specs[i], m), pattern) ? 1 : 0;
      matched = matched || w[i] == 1;
    } else {
      w[i] = trainable_numel(m);
    }
  }
  if (by_type && !matched) {
    std::string names;
    for (size_t i = 0; i < specs.size(); ++i)
      names += (i ? ", " : "") + layer_type_name(specs[i], built[i]);
    throw ConfigError("pipeline.partition = \"" + method + "\": no layer's type matches (types: " +
                      names + ")");
  }
  return w;
}

void print_partition(const std::vector<LayerSpec>& specs, const Partition& p,
                     const std::string& method) {
  std::printf("pipeline: %zu layers on %zu stages (partition \"%s\")\n", specs.size(),
              p.bounds.size() - 1, method.c_str());
  for (size_t s = 0; s + 1 < p.bounds.size(); ++s) {
    std::printf("  stage %zu: layers %lld-%lld (", s, static_cast<long long>(p.bounds[s]),
                static_cast<long long>(p.bounds[s + 1] - 1));
    for (int64_t i = p.bounds[s]; i < p.bounds[s + 1]; ++i)
      std::printf("%s%s", i > p.bounds[s] ? ", " : "", specs[i].name.c_str());
    std::printf("), %lld parameters\n", static_cast<long long>(p.parameters[s]));
  }
  std::fflush(stdout);
}

}  // namespace

std::shared_ptr<PipelineEngine> initialize_pipeline(PipelineInitializeArgs args) {
  auto rt = std::make_unique<PipelineRuntime>();
  const PipelineModule& model = args.model;
  if (model.layers.empty()) throw ConfigError("initialize_pipeline(): the PipelineModule has no layers");
  if (!model.loss_fn) throw ConfigError("initialize_pipeline(): the PipelineModule has no loss_fn");
  if (args.topology && args.comm && args.comm != args.topology->world())
    throw ConfigError(
        "initialize_pipeline(): PipelineInitializeArgs.comm is not "
        "PipelineInitializeArgs.topology->world(); give one of them");
  comm::CommunicatorPtr world = args.topology   ? args.topology->world()
                                : args.comm     ? args.comm
                                : comm::world() ? comm::world()
                                                : comm::make_single_process_communicator();
  const nlohmann::json raw = read_json(args);
  const int stages = stage_count(model, raw);
  if (args.topology && args.topology->grid().pipe_size() != stages)
    throw ConfigError("initialize_pipeline(): PipelineInitializeArgs.topology has pipe size " +
                      std::to_string(args.topology->grid().pipe_size()) +
                      " but pipeline.stages = " + std::to_string(stages));
  const int tensor = args.topology ? args.topology->grid().tensor_size() : 1;
  if (world->world_size() % stages != 0)
    throw ConfigError("pipeline.stages = " + std::to_string(stages) + " does not divide the world size " +
                      std::to_string(world->world_size()));
  if (stages > static_cast<int>(model.layers.size()))
    throw ConfigError("pipeline.stages = " + std::to_string(stages) + " is more than the " +
                      std::to_string(model.layers.size()) + " layers of the PipelineModule");
  const int dp = world->world_size() / (stages * tensor);
  std::vector<std::string> warnings;  // printed once, by the stage engine's own parse below
  const Config config = args.config.empty() ? parse_config(raw, dp, {}, &warnings)
                                            : load_config(args.config, dp, {}, &warnings);
  if (config.zero_optimization.stage >= 3)
    throw ConfigError("zero_optimization.stage = " + std::to_string(config.zero_optimization.stage) +
                      " cannot be combined with pipeline parallelism (pipeline.stages = " +
                      std::to_string(stages) + "): use ZeRO stage 0, 1 or 2 with the pipeline");

  rt->spec = model;
  rt->stages = stages;
  rt->dynamic_shape = args.dynamic_shape;
  rt->topology = args.topology
                     ? args.topology
                     : std::make_shared<comm::Topology>(world, comm::TopologySizes{stages, 1});
  // Set before the engine's configure() (which warns when partition_activations has no group).
  if (tensor > 1) checkpointing::set_model_parallel_group(rt->topology->tensor_parallel());
  rt->pipe = rt->topology->pipe_parallel();
  rt->stage = rt->topology->coordinates().pipe;

  std::string method = model.partition_method.empty() ? config.pipeline.partition
                                                      : model.partition_method;
  if (method == "best") method = "parameters";
  const uint64_t seed = config.seed;
  std::map<size_t, torch::nn::AnyModule> built;
  const auto weights = layer_weights(model.layers, method, seed, built);
  rt->partition = partition_balanced(weights, stages);
  const int64_t begin = rt->partition.bounds[rt->stage], end = rt->partition.bounds[rt->stage + 1];
  std::map<size_t, torch::nn::AnyModule> mine;
  for (int64_t i = begin; i < end; ++i)
    if (built.count(i)) mine[i] = built[i];
  built.clear();  // the other stages' layers are dropped here
  rt->module = StageModule(model.layers, begin, end, seed, std::move(mine));
  // Trainable parameters per stage (a tied module once per stage holding it): each stage counts
  // its own, one sum over the pipe group gathers them.
  at::Tensor counts = torch::zeros({stages}, torch::kLong);
  for (auto& p : rt->module->parameters())
    if (p.requires_grad()) counts[rt->stage] += p.numel();
  if (stages > 1) rt->pipe->all_reduce(counts)->wait();
  for (int st = 0; st < stages; ++st) rt->partition.parameters.push_back(counts[st].item<int64_t>());
  if (world->rank() == 0) print_partition(model.layers, rt->partition, method);
  const int64_t interval = model.activation_checkpoint_interval >= 0
                               ? model.activation_checkpoint_interval
                               : config.pipeline.activation_checkpoint_interval;
  rt->module->set_checkpoint_interval(interval);

  // Tied groups: one split of the world per key, in key order on every rank.
  std::map<std::string, std::set<int>> holders;
  for (int s = 0; s < stages; ++s)
    for (int64_t i = rt->partition.bounds[s]; i < rt->partition.bounds[s + 1]; ++i)
      if (!model.layers[i].tied_key.empty()) holders[model.layers[i].tied_key].insert(s);
  std::vector<at::Tensor> counted_twice;
  for (auto& [key, owners] : holders) {
    if (stages > 1 && owners.size() < 2)
      throw ConfigError("TiedLayerSpec \"" + key + "\": every layer with this key is on stage " +
                        std::to_string(*owners.begin()) +
                        "; a tied layer must span stages (use a LayerSpec, or another partition)");
    if (owners.size() < 2) continue;
    if (config.zero_optimization.stage == 2)
      throw ConfigError("TiedLayerSpec \"" + key + "\" with zero_optimization.stage = 2: tied "
                        "gradients are reduced between stages on whole gradients, which ZeRO-2 "
                        "does not keep; use zero_optimization.stage 0 or 1");
    const bool holder = owners.count(rt->stage) > 0;
    const auto coords = rt->topology->coordinates();
    auto c = world->split(holder ? coords.data * tensor + coords.tensor : -1, coords.pipe);
    if (!holder) continue;
    TiedGroup g{key, c, {}};
    for (auto& p : rt->module->tied().at(key).ptr()->parameters()) g.params.push_back(p);
    {
      torch::NoGradGuard no_grad;
      for (auto& p : g.params) c->broadcast(p, 0)->wait();  // from the lowest holding stage
    }
    if (rt->stage != *owners.begin())
      for (auto& p : g.params)
        if (p.requires_grad()) counted_twice.push_back(p);
    rt->tied.push_back(std::move(g));
  }

  detail::BuildInput in;
  in.module = rt->module.ptr();
  in.config_path = args.config;
  in.config_json = raw;
  in.comm = rt->topology->data_parallel();
  in.device = args.device;
  EngineStatePtr state = detail::build_engine_state(std::move(in));
  state->topology = rt->topology;
  // With tensor parallelism the stage's own norm is counted over its tensor group first
  // (tp/tp_stage.h), then PipeStage sums the stages.
  std::vector<at::Tensor> split;
  if (tensor > 1) {
    split = tp::split_parameters(*rt->module);
    state->stage =
        tp::tensor_parallel_stage(std::move(state->stage), rt->topology->tensor_parallel(), split);
  }
  state->stage = std::make_unique<PipeStage>(std::move(state->stage), rt->pipe, counted_twice,
                                             rt->topology->tensor_parallel(), split);
  auto files = std::make_shared<checkpoint::PipelineFiles>();
  files->stage = rt->stage;
  files->stages = stages;
  files->bounds = rt->partition.bounds;
  files->all = layer_files(model.layers);
  state->pipeline_files = std::move(files);
  return std::make_shared<PipelineEngine>(std::move(state), std::move(rt));
}

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
  return run(schedule(), data, /*train=*/true);
}

double PipelineEngine::eval_batch(const DataIterator& data) {
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
}

namespace {
struct Buffer {
  at::Tensor input, output, labels, grad_output, loss;
};
}  // namespace

double PipelineEngine::run(const Schedule& schedule, const DataIterator& data, bool train) try {
  auto& s = state_of(*this);
  auto& rt = *rt_;
  const int64_t gas = s.config.gradient_accumulation_steps;
  const bool first = rt.stage == 0, last = rt.stage == rt.stages - 1;
  std::vector<Buffer> bufs(schedule.num_buffers);
  at::Tensor eval_loss = torch::zeros({1}, torch::kDouble);
  comm::Communicator& pipe = *rt.pipe;
  using Clock = std::chrono::steady_clock;
  const auto batch_start = Clock::now();
  double compute_s = 0.0, step_s = 0.0;
  auto seconds_since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };

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
          if (!rt.have_recv_meta || rt.dynamic_shape) {
            recv_meta(pipe, rt.stage - 1, rt.recv_shape, rt.recv_dtype);
            rt.have_recv_meta = true;
          }
          at::Tensor t = torch::empty(rt.recv_shape, at::TensorOptions().dtype(rt.recv_dtype).device(s.device));
          pipe.recv(t, rt.stage - 1)->wait();
          if (train && t.is_floating_point()) t.requires_grad_(true);
          bufs[in.buffer].input = t;
          break;
        }
        case Op::ForwardPass: {
          const auto t0 = Clock::now();
          Buffer& b = bufs[in.buffer];
          at::Tensor out = rt.module->forward(b.input);
          if (last) {
            b.loss = rt.spec.loss_fn(out, b.labels);
            TORCH_CHECK(b.loss.numel() == 1, "pipeline: loss_fn must return a scalar, got shape ",
                        b.loss.sizes());
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
          at::Tensor t = b.output.detach().contiguous();
          if (!rt.sent_meta || rt.dynamic_shape) {
            send_meta(pipe, t, rt.stage + 1);
            rt.sent_meta = true;
          }
          pipe.send(t, rt.stage + 1)->wait();
          if (!train) b = Buffer();
          break;
        }
        case Op::RecvGrad: {
          Buffer& b = bufs[in.buffer];
          b.grad_output = torch::empty_like(b.output, at::MemoryFormat::Contiguous);
          pipe.recv(b.grad_output, rt.stage + 1)->wait();
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
          const bool boundary = in.micro_batch == gas - 1;
          if (boundary) s.stage->begin_backward(true);
          if (last) {
            // As Engine::backward: the loss divided by the accumulation steps, times the fp16
            // loss scale (1 otherwise); the batch loss is accumulated for step().
            at::Tensor scaled = gas > 1 ? b.loss / static_cast<double>(gas) : b.loss;
            at::Tensor detached = scaled.detach().to(torch::kDouble).reshape({});
            s.loss_since_boundary =
                s.loss_since_boundary.defined() ? s.loss_since_boundary + detached : detached;
            const double scale = s.loss_scaler->scale();
            (scale != 1.0 ? scaled.to(torch::kFloat) * scale : scaled).backward();
          } else {
            torch::autograd::backward({b.output}, {b.grad_output});
          }
          if (boundary) s.stage->end_backward(true);
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
          TORCH_CHECK(g.defined(), "pipeline: stage ", rt.stage, " got no gradient for its input of "
                      "micro-batch ", in.micro_batch, " (is the activation used?)");
          g = g.contiguous();
          pipe.send(g, rt.stage - 1)->wait();
          b = Buffer();
          break;
        }
        case Op::ReduceTiedGrads: {
          // After the data-parallel reduction (inside the boundary backward): a sum of means is
          // the mean of sums, so the order does not change the result.
          const auto t0 = Clock::now();
          for (auto& g : rt.tied)
            for (auto& p : g.params)
              if (p.requires_grad()) {
                if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
                g.comm->all_reduce(p.mutable_grad())->wait();
              }
          step_s += seconds_since(t0);
          break;
        }
        case Op::ReduceGrads:
          break;  // done by the ZeRO stage inside the boundary micro-batch's backward
        case Op::OptimizerStep: {
          // Engine::step() applies the update at the accumulation boundary; the micro-steps of
          // this batch are counted first.
          s.micro_steps += gas - 1;
          // The other stages would print a loss they do not have; the tensor ranks of the last
          // stage all have it: their rank 0 prints.
          s.log_steps = last && rt.topology->coordinates().tensor == 0;
          const auto t0 = Clock::now();
          Engine::step();
          step_s += seconds_since(t0);
          break;
        }
      }
    }
  }

  // The batch loss on every rank: the last stage's mean over its data-parallel group, sent to
  // the other stages of the pipe.
  double loss = s.last_loss;
  if (!train) {
    s.comm->all_reduce(eval_loss)->wait();
    loss = eval_loss.item<double>() / (gas * s.comm->world_size());
  }
  if (rt.stages > 1) {
    at::Tensor t = torch::full({1}, last ? loss : 0.0, torch::kDouble);
    pipe.broadcast(t, rt.stages - 1)->wait();
    loss = t.item<double>();
  }
  if (train) {
    s.last_loss = loss;
    rt.timing = {seconds_since(batch_start), compute_s, step_s};
  }
  return loss;
} catch (const c10::Error& e) {
  report_torch_error(train ? "train_batch" : "eval_batch", e);
}

}  // namespace pipe
}  // namespace deepspeed
