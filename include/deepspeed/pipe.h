// Pipeline parallelism (DeepSpeed's deepspeed.pipe): a model given as a sequence of layer specs,
// cut into stages, trained with the 1F1B schedule by PipelineEngine::train_batch().
//
//   std::vector<deepspeed::pipe::LayerSpec> layers = {
//       deepspeed::pipe::TiedLayerSpec("embed", [] { return torch::nn::AnyModule(Embedding(...)); }),
//       deepspeed::pipe::LayerSpec("block", [] { return torch::nn::AnyModule(Block(...)); }), ...
//       deepspeed::pipe::TiedLayerSpec("embed", ..., /*forward=*/head_fn)};
//   deepspeed::pipe::PipelineModule model{layers, loss_fn};
//   auto engine = deepspeed::pipe::initialize_pipeline({model, "ds_config.json"});
//   double loss = engine->train_batch(next_micro_batch);   // on every rank
//
// Activations between layers are ONE tensor (the representation chosen here: every layer maps a
// tensor to a tensor; a layer that needs more packs it into one tensor). Rank layout: the grid of
// comm::Topology (pipe-major; the data-parallel peers of a stage are consecutive ranks).
//
// Tensor parallelism inside each stage (world = pipe x data x tensor, tensor fastest): give
// PipelineInitializeArgs.topology with tensor > 1 and layers built over its tensor_parallel()
// group (e.g. deepspeed::tp layers; examples/gpt/tp_pipeline_model.h). Each tensor rank of a
// stage sends its activations to, and receives gradients from, the same tensor rank of the
// neighbouring stage (the pipe group holds one tensor coordinate), so the activations between
// stages must be replicated across the tensor group (what a row-parallel layer's all-reduce
// leaves). The gradient norm counts split parameters once over the tensor group, replicated
// ones once, and tied ones once over the stages.
//
// Every layer is built with the RNG seeded from (config seed, layer index) — DeepSpeed's
// seed_layers, here always on — so the weights do not depend on the layout: the same model on
// pipe 2 x data 2 and on 4 data-parallel ranks starts identical (what the equivalence tests and
// checkpoint resharding rely on). Partitioning by "parameters" or "type:" builds each spec once
// on every rank to count (and keeps only the stage's own layers).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/modules/container/any.h>

#include "deepspeed/engine.h"
#include "deepspeed/topology.h"

namespace deepspeed {
namespace pipe {

// Applies a layer: the default calls the module's forward(tensor).
using LayerForward = std::function<at::Tensor(torch::nn::AnyModule&, const at::Tensor&)>;

struct LayerSpec {
  std::string name;  // printed in the partition; a plain callable's type name for "type:"
  // Builds the module; empty for a plain callable (no parameters).
  std::function<torch::nn::AnyModule()> build;
  // For a module: how to apply it (default: module.forward(x)). For a plain callable: required,
  // called with an empty AnyModule.
  LayerForward forward;
  // Non-empty: a tied layer (TiedLayerSpec). Every spec with this key shares one module per stage.
  std::string tied_key;

  LayerSpec() = default;
  LayerSpec(std::string name, std::function<torch::nn::AnyModule()> build,
            LayerForward forward = nullptr)
      : name(std::move(name)), build(std::move(build)), forward(std::move(forward)) {}
};

// A parameter-free layer (activation, reshape): fn(x).
LayerSpec Lambda(std::string name, std::function<at::Tensor(const at::Tensor&)> fn);

// A layer whose module is shared by every spec with the same key (embedding reused as the LM
// head): the stages that hold the key each build one module; its weights are broadcast from the
// lowest such stage at start and its gradients all-reduced between them before the step.
// `forward` (optional) applies it differently at this position (e.g. logits = x @ weight^T).
LayerSpec TiedLayerSpec(std::string key, std::function<torch::nn::AnyModule()> build,
                        LayerForward forward = nullptr, std::string name = "");

// (outputs of the last layer, labels) -> scalar loss of one micro-batch.
using LossFn = std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>;

struct PipelineModule {
  std::vector<LayerSpec> layers;
  LossFn loss_fn;
  // 0: the config's pipeline.stages (which must then be a number).
  int num_stages = 0;
  // "parameters" (balance trainable-parameter counts), "uniform" (balance layer counts),
  // "type:<regex>" (balance the layers whose type name matches). Empty: the config's
  // pipeline.partition ("best" there means "parameters").
  std::string partition_method;
  // Layers per checkpointed segment (deepspeed::checkpointing); 0 = none; -1: the config's
  // pipeline.activation_checkpoint_interval.
  int64_t activation_checkpoint_interval = -1;
};

// Which layers each stage holds: stage s owns [bounds[s], bounds[s + 1]).
struct Partition {
  std::vector<int64_t> bounds;
  std::vector<int64_t> parameters;  // trainable parameters per stage (tied counted per holder)
};
// Cuts `weights` (one per layer) into `stages` contiguous non-empty parts as DeepSpeed's
// partition_balanced: the smallest spread between the heaviest and the lightest part, the last
// cut on ties (7 equal layers over 3 stages are 3, 2, 2); as many layers as stages: one each.
// Throws ConfigError when stages > layers (DeepSpeed leaves stages empty).
Partition partition_balanced(const std::vector<int64_t>& weights, int stages);
// partition_method "uniform": equal layer counts, the remainder one layer each to the first
// stages (DeepSpeed's partition_uniform: 7 layers over 3 stages are 3, 2, 2).
Partition partition_uniform(int64_t layers, int stages);

// The whole PipelineModule as one module on one rank, with the same initial weights as the
// pipeline (layers seeded from `seed` + index): forward(inputs, labels) = loss_fn(layers(inputs),
// labels). What the pipeline is compared against; usable with deepspeed::initialize().
class PipelineSequentialImpl : public torch::nn::Module {
 public:
  PipelineSequentialImpl(const PipelineModule& model, uint64_t seed);
  at::Tensor forward(const at::Tensor& inputs, const at::Tensor& labels);

 private:
  std::function<at::Tensor(const at::Tensor&)> layers_;
  LossFn loss_fn_;
};

// One step of a schedule (DeepSpeed's PipeInstruction).
enum class Op {
  LoadMicroBatch, ForwardPass, BackwardPass, SendActivation, RecvActivation, SendGrad, RecvGrad,
  ReduceTiedGrads, ReduceGrads, OptimizerStep
};
struct Instruction {
  Op op;
  int buffer = -1;       // pipe buffer index; -1 for the reductions and the step
  int micro_batch = -1;  // the micro-batch it moves or computes; -1 for the reductions and the step
  bool operator==(const Instruction& o) const {
    return op == o.op && buffer == o.buffer && micro_batch == o.micro_batch;
  }
};
std::string to_string(const Instruction& instruction);  // "ForwardPass(buffer=0, mb=3)"

// A whole schedule for one stage: steps[i] runs at clock tick i.
struct Schedule {
  std::vector<std::vector<Instruction>> steps;
  int num_buffers = 0;
  std::string str() const;  // one line per step
};
// 1F1B (DeepSpeed's TrainSchedule, PipeDream-Flush): 2 * (M + S - 1) steps, max(2, min(S -
// stage, M)) buffers.
Schedule train_schedule(int micro_batches, int stages, int stage);
// Forward only (DeepSpeed's InferenceSchedule): M + S - 1 steps, 2 buffers.
Schedule inference_schedule(int micro_batches, int stages, int stage);

// One micro-batch: (inputs, labels). The first stage uses the inputs, the last the labels.
using MicroBatch = std::pair<at::Tensor, at::Tensor>;
using DataIterator = std::function<MicroBatch()>;

struct PipelineInitializeArgs {
  PipelineModule model;
  std::string config;          // path to ds_config.json (or config_json)
  nlohmann::json config_json;
  // The world; default init_distributed()'s, which is called here when the launcher's
  // environment says this process is one of several (as initialize()), else single process.
  comm::CommunicatorPtr comm;
  // The grid, when the layers need its groups before the engine exists (tensor parallelism:
  // built over topology->tensor_parallel()). Its pipe size must be the stage count and its world
  // `comm` (when given). Null: pipe x data over `comm`, built here.
  std::shared_ptr<comm::Topology> topology;
  // The trainer's values (batch sizes, learning rate, ...): fill "auto" keys by Hugging Face's
  // rules, as InitializeArgs.overrides does (docs/config.md, "auto" values). The batch sizes are
  // per data-parallel rank of a stage.
  ConfigOverrides overrides;
  std::string device = "auto";
  // Shapes of activations are sent once (first micro-batch); true: before every micro-batch.
  bool dynamic_shape = false;
};

class PipelineEngine;
std::shared_ptr<PipelineEngine> initialize_pipeline(PipelineInitializeArgs args);

struct PipelineRuntime;  // private (src/pipe/pipeline_runtime.h)

// The engine of one pipeline stage: an Engine over the stage's own parameters and its
// data-parallel group (ZeRO 0-2 across the group), driven by the schedule.
class PipelineEngine : public Engine {
 public:
  PipelineEngine(EngineStatePtr state, std::unique_ptr<PipelineRuntime> runtime);
  ~PipelineEngine() override;

  // One global batch: gradient_accumulation_steps micro-batches through the 1F1B schedule, then
  // the optimizer step. Returns the batch loss (mean over micro-batches and data-parallel ranks)
  // on EVERY rank. COLLECTIVE over the world. `data` is called once per micro-batch on the first
  // and the last stage only.
  double train_batch(const DataIterator& data);
  // Forward only over gradient_accumulation_steps micro-batches; the mean loss on every rank.
  double eval_batch(const DataIterator& data);

  // The per-micro-batch loop does not exist with a pipeline (DeepSpeed raises too).
  [[noreturn]] at::Tensor forward(const at::Tensor&);
  [[noreturn]] at::Tensor backward(const at::Tensor&);
  [[noreturn]] void step();
  // save_checkpoint / load_checkpoint are Engine's, COLLECTIVE over every stage: DeepSpeed's
  // pipeline layout (layer_XX-model_states files; docs/checkpoints.md), loadable at another
  // (stages, data-parallel) layout and exportable with ds_to_fp32.

  int stage_id() const;
  int num_stages() const;
  bool is_first_stage() const { return stage_id() == 0; }
  bool is_last_stage() const { return stage_id() == num_stages() - 1; }
  const Partition& partition() const;
  // The most forward activations this stage held at once (awaiting their backward), over all
  // train_batch calls so far; 1F1B keeps it at most num_stages() - stage_id().
  int max_activations_held() const;
  // The schedule train_batch runs (for printing).
  Schedule schedule() const;
  // The last train_batch on this rank: wall-clock seconds, and the part spent computing forward
  // and backward passes (the rest is waiting for neighbours — the pipeline bubble — transfers
  // and the step). For the benchmark's measured bubble.
  struct BatchTiming {
    double wall_s = 0.0;
    double compute_s = 0.0;
    // The optimizer step and the tied-gradient reduction at the batch's end: outside the
    // schedule the 1F1B bubble (p - 1) / (m + p - 1) describes, so the benchmark leaves it out.
    double step_s = 0.0;
  };
  BatchTiming last_batch_timing() const;

 private:
  // Runs the schedule; returns the batch loss (on every rank).
  double run(const Schedule& schedule, const DataIterator& data, bool train);
  std::unique_ptr<PipelineRuntime> rt_;
};

}  // namespace pipe
}  // namespace deepspeed
