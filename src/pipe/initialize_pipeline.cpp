// initialize_pipeline(): checks the config against the model and the world, cuts the layers
// into stages, builds this stage's layers, ties the layers shared between stages, and wraps the
// stage's ordinary Engine state (ZeRO 0-2 over its data-parallel group) in a PipelineEngine.
// Separate from the engine because it runs once, before any schedule, and everything it decides
// is fixed for the engine's life.
#include <torch/torch.h>

#include <climits>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "comm/checked_communicator.h"
#include "comm/launch_world.h"
#include "config/blocks.h"
#include "config/hjson_reader.h"
#include "deepspeed/checkpointing.h"
#include "deepspeed/topology.h"
#include "deepspeed/tp.h"
#include "monitor/training_monitor.h"
#include "pipe/partition_method.h"
#include "pipe/pipe_stage.h"
#include "pipe/pipeline_runtime.h"
#include "runtime/engine_state.h"
#include "tp/tp_stage.h"

namespace deepspeed {
namespace pipe {

namespace {

// The stage count: the module's, else the config's pipeline.stages, read by parse_config's rule
// (4, 4.0 and "4" alike; "auto" leaves it to the module).
int stage_count(const PipelineModule& model, const nlohmann::json& cfg) {
  if (model.num_stages > 0) return model.num_stages;
  const auto pipeline = cfg.find("pipeline");  // end() when cfg is not an object
  if (pipeline != cfg.end() && pipeline->is_object()) {
    const auto v = pipeline->find("stages");
    if (v != pipeline->end() && !v->is_null()) {
      const std::optional<int64_t> n = config::pipeline_stage_count(*v, "pipeline.stages");
      if (n && *n > INT_MAX) throw ConfigError("pipeline.stages = " + v->dump() + " is too large");
      if (n) return static_cast<int>(*n);
    }
  }
  throw ConfigError("pipeline.stages: give the number of stages in the config (\"pipeline\": "
                    "{\"stages\": N}) or in PipelineModule.num_stages");
}

// The config as load_config reads a file (hjson, as DeepSpeed does: comments, trailing commas).
nlohmann::json read_json(const PipelineInitializeArgs& args) {
  if (args.config.empty()) return args.config_json;
  std::ifstream in(args.config, std::ios::binary);
  if (!in) throw ConfigError("initialize_pipeline(): cannot read config file " + args.config);
  std::ostringstream text;
  text << in.rdbuf();
  return config::parse_hjson(text.str(), args.config);  // errors name the file and position
}

// Cuts the layers into stages by the partition method and builds this stage's layers (the ones
// built to weigh them are kept). Fills rt.partition (with every stage's parameter count: one sum
// over the pipe group, so COLLECTIVE over it) and rt.module. `print`: rank 0 prints the partition.
void build_stage_layers(PipelineRuntime& rt, const Config& config, bool print) {
  const bool from_module = !rt.spec.partition_method.empty();
  const std::string method = normalized_partition_method(
      from_module ? rt.spec.partition_method : config.pipeline.partition);
  const uint64_t seed = config.seed;
  std::map<size_t, torch::nn::AnyModule> built;
  const auto weights =
      layer_weights(rt.spec.layers, method,
                    from_module ? "PipelineModule.partition_method" : "pipeline.partition", seed,
                    built);
  rt.partition = method == "uniform"
                     ? partition_uniform(static_cast<int64_t>(weights.size()), rt.stages)
                     : partition_balanced(weights, rt.stages);
  const int64_t begin = rt.partition.bounds[rt.stage], end = rt.partition.bounds[rt.stage + 1];
  std::map<size_t, torch::nn::AnyModule> mine;
  for (int64_t i = begin; i < end; ++i)
    if (built.count(i)) mine[i] = built[i];
  built.clear();  // the other stages' layers are dropped here
  rt.module = StageModule(rt.spec.layers, begin, end, seed, std::move(mine));
  // Trainable parameters per stage (a tied module once per stage holding it): each stage counts
  // its own, one sum over the pipe group gathers them.
  at::Tensor counts = torch::zeros({rt.stages}, torch::kLong);
  for (auto& p : rt.module->parameters())
    if (p.requires_grad()) counts[rt.stage] += p.numel();
  if (rt.stages > 1) rt.pipe->all_reduce(counts)->wait();
  for (int st = 0; st < rt.stages; ++st)
    rt.partition.parameters.push_back(counts[st].item<int64_t>());
  if (print) print_partition(rt.spec.layers, rt.partition, method);
  const int64_t interval = rt.spec.activation_checkpoint_interval >= 0
                               ? rt.spec.activation_checkpoint_interval
                               : config.pipeline.activation_checkpoint_interval;
  rt.module->set_checkpoint_interval(interval);
}

// The stage's ordinary Engine state (ZeRO 0-2 over its data-parallel group, built as
// deepspeed::initialize builds it) with the pipeline around its ZeRO stage: the gradient norm
// summed over the stages (PipeStage) and the per-layer checkpoint layout.
EngineStatePtr build_stage_state(PipelineRuntime& rt, const PipelineInitializeArgs& args,
                                 const nlohmann::json& raw,
                                 const std::vector<at::Tensor>& counted_twice) {
  detail::BuildInput in;
  in.module = rt.module.ptr();
  in.config_path = args.config;
  in.config_json = raw;
  in.comm = rt.topology->data_parallel();
  in.overrides = args.overrides;
  in.device = args.device;
  in.pipeline_stage = true;
  in.prints_config_warnings = rt.topology->world()->rank() == 0;
  EngineStatePtr state = detail::build_engine_state(std::move(in));
  state->topology = rt.topology;
  // With tensor parallelism the stage's own norm is counted over its tensor group first
  // (tp/tp_stage.h), then PipeStage sums the stages.
  std::vector<at::Tensor> split;
  if (rt.topology->grid().tensor_size() > 1) {
    split = tp::split_parameters(*rt.module);
    state->stage =
        tp::tensor_parallel_stage(std::move(state->stage), rt.topology->tensor_parallel(), split);
  }
  state->stage = std::make_unique<PipeStage>(std::move(state->stage), rt.pipe, counted_twice,
                                             rt.topology->tensor_parallel(), split);
  auto files = std::make_shared<checkpoint::PipelineFiles>();
  files->stage = rt.stage;
  files->stages = rt.stages;
  files->bounds = rt.partition.bounds;
  files->all = layer_files(rt.spec.layers);
  state->pipeline_files = std::move(files);
  // The monitors are written where the step line is printed: the last stage knows the loss.
  const comm::Coordinates at = rt.topology->coordinates();
  state->monitor->as_pipeline_stage(rt.stage == rt.stages - 1 && at.data == 0 && at.tensor == 0);
  return state;
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
  // Without a topology, comm or init_distributed(), a launched job is joined here
  // (comm/launch_world.h).
  comm::CommunicatorPtr world =
      args.topology ? args.topology->world()
                    : comm::world_or_launch(
                          "initialize_pipeline()", args.comm,
                          comm::init_options_for_config(args.config, args.config_json));
  const nlohmann::json raw = read_json(args);
  const int stages = stage_count(model, raw);
  // The errors below name where the count came from.
  const std::string stages_key =
      (model.num_stages > 0 ? "PipelineModule.num_stages = " : "pipeline.stages = ") +
      std::to_string(stages);
  if (args.topology && args.topology->grid().pipe_size() != stages)
    throw ConfigError("initialize_pipeline(): PipelineInitializeArgs.topology has pipe size " +
                      std::to_string(args.topology->grid().pipe_size()) + " but " + stages_key);
  const int tensor = args.topology ? args.topology->grid().tensor_size() : 1;
  if (world->world_size() % stages != 0)
    throw ConfigError(stages_key + " does not divide the world size " +
                      std::to_string(world->world_size()));
  if (stages > static_cast<int>(model.layers.size()))
    throw ConfigError(stages_key + " is more than the " + std::to_string(model.layers.size()) +
                      " layers of the PipelineModule");
  const int dp = world->world_size() / (stages * tensor);
  std::vector<std::string> warnings;  // printed once, by the stage engine's own parse below
  const Config config = args.config.empty()
                            ? parse_config(raw, dp, args.overrides, &warnings)
                            : load_config(args.config, dp, args.overrides, &warnings);
  if (config.zero_optimization.stage >= 3)
    throw ConfigError("zero_optimization.stage = " + std::to_string(config.zero_optimization.stage) +
                      " cannot be combined with pipeline parallelism (" + stages_key +
                      "): use ZeRO stage 0, 1 or 2 with the pipeline");

  // comms_check: the world is wrapped before the topology splits its groups, so that every group
  // (pipe, data-parallel, tied) is checked, not only the stage engine's data-parallel group; a
  // given topology's world must have been wrapped before it split them.
  if (config.comms_check || comm::comms_check_from_env()) {
    if (args.topology)
      comm::require_checked_topology(
          *args.topology, "initialize_pipeline(): PipelineInitializeArgs.topology",
          config.comms_check);
    else
      world = comm::with_comms_check(world);
  }
  rt->spec = model;
  rt->stages = stages;
  rt->topology = args.topology
                     ? args.topology
                     : std::make_shared<comm::Topology>(world, comm::TopologySizes{stages, 1});
  // Set before the engine's configure() (which warns when partition_activations has no group).
  if (tensor > 1) checkpointing::set_model_parallel_group(rt->topology->tensor_parallel());
  rt->pipe = rt->topology->pipe_parallel();
  rt->stage = rt->topology->coordinates().pipe;
  LinkSlicing slicing;
  if (tensor > 1) slicing.tensor_group = rt->topology->tensor_parallel();
  slicing.activations = config.pipeline.pipe_partitioned;
  slicing.gradients = config.pipeline.grad_partitioned;
  rt->link = std::make_unique<StageLink>(rt->pipe, rt->stage, args.dynamic_shape, slicing);

  build_stage_layers(*rt, config, world->rank() == 0);
  tp::check_split_layers(*rt->module, args.topology.get(),
                         "initialize_pipeline(): PipelineInitializeArgs.topology");

  // Tied groups: one split of the world per key, in key order on every rank.
  TiedLayers tied = tie_layers(model, rt->partition, *rt->module, *rt->topology,
                               config.zero_optimization.stage);
  const bool tied_across_stages = tied.spans_stages;
  rt->tied = std::move(tied.groups);

  EngineStatePtr state = build_stage_state(*rt, args, raw, tied.counted_twice);
  // Tied gradients are summed between stages after the backward's reduction: an optimizer that
  // takes its ranges during that reduction would update with each stage's own part (the tied
  // copies drift apart). Every rank refuses alike: the same config, and whether a key spans
  // stages is known to every stage, also one in the middle holding none.
  if (tied_across_stages && state->stage->steps_during_backward())
    throw ConfigError("a PipelineModule with TiedLayerSpec and "
                      "zero_optimization.offload_optimizer.overlap_step (on by default on a GPU): "
                      "the optimizer would update tied parameters before their gradients are "
                      "summed across stages; set overlap_step to false");
  return std::make_shared<PipelineEngine>(std::move(state), std::move(rt));
}

}  // namespace pipe
}  // namespace deepspeed
