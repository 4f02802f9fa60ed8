// ds_config.json → typed structs with DeepSpeed's defaults (code defaults, not doc defaults; see
// docs/config.md for every key and where deepspeed.cpp differs).
//
// Parsing rules: numbers may be written 5e8 or "5e8"; booleans true/"true"; an unknown key is a
// warning naming its path; "auto" is an error unless initialize() can resolve it; bad values throw
// ConfigError naming key path, value and what was expected.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "deepspeed/errors.h"

namespace deepspeed {

// "optimizer": {"type": ..., "params": {...}}. Params are kept as JSON and turned into typed
// hyper-parameters by the optimizer factory (src/optim), which names bad keys as optimizer.params.X.
struct OptimizerConfig {
  std::string type;              // "Adam", "AdamW", "SGD", ... (matched case-insensitively)
  nlohmann::json params = nlohmann::json::object();
};

// "scheduler": {"type": ..., "params": {...}}; params validated by src/optim/lr_schedules.
struct SchedulerConfig {
  std::string type;              // WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest
  nlohmann::json params = nlohmann::json::object();
};

struct Fp16Config {
  bool enabled = false;              // fp16.enabled
  bool auto_cast = false;            // fp16.auto_cast
  double loss_scale = 0.0;           // fp16.loss_scale: 0 = dynamic, >0 = static scale
  int initial_scale_power = 16;      // fp16.initial_scale_power: initial scale 2^power
  int loss_scale_window = 1000;      // fp16.loss_scale_window: clean steps before doubling
  int hysteresis = 2;                // fp16.hysteresis: overflows tolerated before halving
  bool consecutive_hysteresis = false;  // fp16.consecutive_hysteresis
  double min_loss_scale = 1.0;       // fp16.min_loss_scale: floor of the scale
  // fp16.fp16_master_weights_and_grads (default false): the ZeRO optimizer keeps its master
  // weights (and the gradient partition) in fp16 instead of fp32, with fp32 moments, updated by
  // the CPU Adam. Stages 1-3 with offload_optimizer.device "cpu" and Adam/AdamW, as DeepSpeed.
  bool fp16_master_weights_and_grads = false;
  // True when the block named any of the five dynamic-scaler keys; DeepSpeed's ZeRO scaler then
  // uses them, otherwise its built-in defaults (2^32 initial, hysteresis 1). See docs/config.md.
  bool dynamic_keys_given = false;
};

struct Bf16Config {
  bool enabled = false;              // bf16.enabled (block alias "bfloat16")
  bool immediate_grad_update = false;
  // bf16.check_grad_overflow (default false): every step votes across ranks on inf/NaN gradients
  // and an overflowed step is skipped (no update, no scheduler step, skipped_steps += 1), as fp16
  // always does. bf16's scaler is static, so no scale changes.
  bool check_grad_overflow = false;
  // bf16.bf16_master_weights_and_grads (default false): master weights and gradient partition in
  // bf16 instead of fp32 (ZeRO stages 1-3, Adam/AdamW). Without bf16_optimizer_states the moments
  // stay fp32 and the update runs on the CPU (offload_optimizer.device "cpu"), as DeepSpeed.
  bool bf16_master_weights_and_grads = false;
  // bf16.bf16_optimizer_states (default false): Adam's moments in bf16 too; needs
  // bf16_master_weights_and_grads.
  bool bf16_optimizer_states = false;
};

// offload_param / offload_optimizer blocks. After parsing, offload_param is enabled only at stage 3
// and offload_optimizer only at stages 1-3 (DeepSpeed ignores them elsewhere; we warn and read
// them back as "none"), so later code can trust enabled().
struct OffloadConfig {
  std::string device = "none";       // "none" | "cpu" | "nvme"
  std::string nvme_path;             // required when device == "nvme"
  bool pin_memory = false;
  int64_t buffer_count = 4;          // offload_param default 5, offload_optimizer default 4
  int64_t buffer_size = 100000000;   // offload_param only: elements per swap buffer
  int64_t max_in_cpu = 1000000000;   // offload_param only
  bool pipeline_read = false;        // offload_optimizer only
  bool pipeline_write = false;       // offload_optimizer only
  bool fast_init = false;            // offload_optimizer only
  double ratio = 1.0;                // offload_optimizer only; < 1 requires stage 3
  // offload_optimizer only, deepspeed.cpp's own: the CPU update of each gradient bucket runs
  // during backward (unset: on when the partition is on a GPU; docs/config.md).
  std::optional<bool> overlap_step;
  // offload_optimizer only, deepspeed.cpp's own: what the update during backward has not done
  // when step() is called runs on into the next forward (docs/config.md).
  bool overlap_forward = false;
  bool enabled() const { return device != "none"; }
};

// zero_optimization.leaf_module (recent DeepSpeed releases): modules stage 3 gathers whole, with
// every ZeroUnit under them (docs/zero3.md, "Fewer, larger gathers"). Each entry may match any
// module.
struct LeafModuleConfig {
  // C++ type names, with or without namespaces and "Impl": "gpt::MLPImpl", "MLPImpl", "MLP". A
  // ZeroUnit matches by the module it wraps too.
  std::vector<std::string> classes;
  std::vector<std::string> names;          // qualified module names: "block0.mlp"
  std::vector<std::string> name_suffixes;  // the end of a qualified name: "mlp" or ".mlp"
  bool empty() const { return classes.empty() && names.empty() && name_suffixes.empty(); }
};

struct ZeroConfig {
  int stage = 0;                                  // 0 off, 1 optimizer states, 2 +gradients, 3 +params
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
  int64_t reduce_bucket_size = 500000000;         // elements per gradient reduction bucket
  bool use_multi_rank_bucket_allreduce = true;
  bool allgather_partitions = true;
  int64_t allgather_bucket_size = 500000000;      // elements per all-gather chunk
  std::optional<bool> overlap_comm;               // unset: true for stage 3, false otherwise
  bool load_from_fp32_weights = true;
  bool elastic_checkpoint = false;
  OffloadConfig offload_param;                    // stage 3 only
  OffloadConfig offload_optimizer;
  int64_t sub_group_size = 1000000000;
  int64_t stage3_prefetch_bucket_size = 50000000;
  int64_t stage3_param_persistence_threshold = 100000;
  int64_t stage3_model_persistence_threshold = INT64_MAX;
  int64_t stage3_max_live_parameters = 1000000000;
  int64_t stage3_max_reuse_distance = 1000000000;
  bool stage3_gather_16bit_weights_on_model_save = false;
  // Units nested in a module of at most this many parameters per layer are gathered with the
  // unit around them (docs/zero3.md, "Fewer, larger gathers"); 0: every ZeroUnit on its own.
  int64_t stage3_module_granularity_threshold = 0;
  LeafModuleConfig leaf_module;
  bool ignore_unused_parameters = true;
  bool round_robin_gradients = false;
  // deepspeed.cpp's own key: the gradient partition (stages 2 and 3, on the compute device) is
  // freed after each step and allocated again when backward's first reduced gradient arrives, so
  // it does not sit beside the next forward's activations, as DeepSpeed's _release_ipg_buffers
  // frees grads_in_partition. Unset: on a GPU (the caching allocator hands the block back at no
  // cost), off on the CPU (a fresh allocation there costs a page fault per page every step).
  std::optional<bool> release_gradients;
  // deepspeed.cpp's own key (Megatron-LM's --overlap-param-gather): at stages 1 and 2 with
  // data-parallel peers, engine.step() launches the all-gather of the updated partitions and
  // returns; each ZeroUnit waits for its own parameters just before it runs in the next forward.
  // Off by default: a program that reads the parameters itself between step() and the next
  // forward calls engine.complete_step() first.
  bool overlap_param_gather = false;
  // ZeRO++ (stage 3 only; ignored with a warning at stages 0-2, as DeepSpeed ignores them there).
  // zero_quantized_weights: the forward all-gather of a unit moves int8 blocks (qwZ).
  bool zero_quantized_weights = false;
  // zero_hpz_partition_size: after a unit's forward gather each rank keeps the unit's 1/hpz for
  // its group of hpz consecutive ranks, so the backward gather stays in the group (hpZ). 1 = off;
  // must divide the data-parallel world size (a larger value is cut to it, as DeepSpeed does).
  int64_t zero_hpz_partition_size = 1;
  // zero_quantized_gradients: gradient reduce-scatter as an int8 all-to-all, summed in fp32 (qgZ).
  bool zero_quantized_gradients = false;
  bool overlap_comm_enabled() const { return overlap_comm.value_or(stage == 3); }
};

struct AioConfig {
  int64_t block_size = 1048576;
  int64_t queue_depth = 8;
  int64_t intra_op_parallelism = 1;   // alias thread_count
  bool single_submit = false;
  bool overlap_events = true;
  bool use_gds = false;
};

struct ActivationCheckpointingConfig {
  bool partition_activations = false;
  bool cpu_checkpointing = false;
  bool contiguous_memory_optimization = false;
  // Sizes the contiguous buffer: used (and must be >= 1) only with contiguous_memory_optimization.
  std::optional<int64_t> number_checkpoints;
  bool synchronize_checkpoint_boundary = false;
  bool profile = false;
};

struct PipelineConfig {
  std::string stages = "auto";
  std::string partition = "best";
  bool seed_layers = false;
  int64_t activation_checkpoint_interval = 0;
  bool pipe_partitioned = true;
  bool grad_partitioned = true;
};

// flops_profiler block (docs/monitoring.md#flops_profiler).
struct FlopsProfilerConfig {
  bool enabled = false;               // "enabled": profile one step on rank 0
  int64_t profile_step = 1;           // "profile_step": the optimizer step (0-based) profiled
  int64_t module_depth = -1;          // "module_depth": depths of the aggregated profile (-1 all)
  int64_t top_modules = 1;            // "top_modules": modules per depth in the aggregated profile
  bool detailed = true;               // "detailed": print the annotated module tree
  std::string output_file;            // "output_file": empty: stdout
  double recompute_fwd_factor = 0.0;  // "recompute_fwd_factor": bwd FLOPs = (2 + this) x fwd
  // "peak_tflops" (deepspeed.cpp extension, >= 0): the device's peak TFLOPS; > 0 adds the model
  // FLOP utilisation line to the summary.
  double peak_tflops = 0.0;
};

// tensorboard / csv_monitor blocks.
struct MonitorConfig {
  bool enabled = false;
  std::string output_path;
  std::string job_name = "DeepSpeedJobName";
};

struct CheckpointConfig {
  std::string tag_validation = "Warn";   // Ignore | Warn | Fail
  bool load_universal = false;
  bool use_node_local_storage = false;
  // parallel_write.pipeline_stage: a pipeline stage's layer files are written by its
  // data-parallel ranks in turn instead of all by its data-parallel rank 0.
  bool parallel_write_pipeline_stage = false;
};

struct CommsLoggerConfig {
  bool enabled = false;
  bool verbose = false;
  bool prof_all = true;
  bool debug = false;
};

// "timers": {"throughput": {...}} (DeepSpeed's ThroughputTimer): the samples/s of rank 0's step
// line (docs/monitoring.md).
struct ThroughputTimerConfig {
  bool enabled = true;  // false: the step line leaves samples/s out
  // On a CUDA device the step that prints the line waits for the device first, so samples/s
  // counts the work queued in the interval, not just its queuing (DeepSpeed synchronizes at each
  // start and stop of its timer). No effect on the CPU.
  bool synchronized = true;
};

struct Config {
  // Batch sizes after resolution (resolve_batch_sizes); all three > 0 and
  // train_batch_size == train_micro_batch_size_per_gpu * gradient_accumulation_steps * dp_world_size.
  int64_t train_batch_size = 0;
  int64_t train_micro_batch_size_per_gpu = 0;
  int64_t gradient_accumulation_steps = 0;

  std::optional<OptimizerConfig> optimizer;
  std::optional<SchedulerConfig> scheduler;
  Fp16Config fp16;
  Bf16Config bf16;
  ZeroConfig zero_optimization;
  AioConfig aio;
  ActivationCheckpointingConfig activation_checkpointing;
  PipelineConfig pipeline;
  FlopsProfilerConfig flops_profiler;
  MonitorConfig tensorboard;
  MonitorConfig csv_monitor;
  CheckpointConfig checkpoint;
  CommsLoggerConfig comms_logger;
  ThroughputTimerConfig throughput_timer;  // "timers.throughput"

  double gradient_clipping = 0.0;  // global-norm clip when > 0; 0 or < 0 disables (DeepSpeed's)
  // Both refused at ZeRO stage 2 with zero_optimization.reduce_scatter, as DeepSpeed asserts.
  bool prescale_gradients = false;         // divide by DP before the all-reduce
  double gradient_predivide_factor = 1.0;  // post-scale mode: x1/f before, xf/DP after
  std::string communication_data_type;     // "", "fp32", "fp16", "bf16" ("" = gradient dtype)
  std::string grad_accum_dtype;            // data_types.grad_accum_dtype: "", fp32, fp16, bf16
  int64_t steps_per_print = 10;            // DeepSpeed's code has None (no print); we print every 10
  bool wall_clock_breakdown = false;
  bool memory_breakdown = false;
  bool dump_state = false;
  bool dataloader_drop_last = false;
  bool zero_allow_untested_optimizer = false;
  bool zero_force_ds_cpu_optimizer = true;
  uint64_t seed = 1234;                    // "seed": sampler shuffling and engine RNG
  int64_t comm_timeout_seconds = 1800;     // "comm_timeout_seconds" (deepspeed.cpp extension)
  bool comms_check = false;  // "comms_check" (extension): compare every collective across ranks

  nlohmann::json raw;                      // the document as read, "auto" keys filled
  // The keys that were "auto" and the values ConfigOverrides filled them with, in fill order.
  std::vector<std::pair<std::string, nlohmann::json>> auto_filled;
};

// Values from initialize() that fill "auto" keys: what a trainer knows (Hugging Face's
// TrainingArguments and the model's config), applied by HF's rules
// (transformers.integrations.deepspeed; docs/config.md, "auto" values). A value left unset fills
// nothing, and a key still "auto" after filling is a ConfigError naming it. A key the config sets
// explicitly must equal the value given here (HF's mismatch check), else a ConfigError lists every
// disagreement; with fill_only the config's explicit values win instead.
struct ConfigOverrides {
  std::optional<int64_t> train_micro_batch_size_per_gpu;  // HF per_device_train_batch_size
  std::optional<int64_t> gradient_accumulation_steps;
  std::optional<int64_t> train_batch_size;  // HF: world size * micro batch * accumulation
  // optimizer.params.lr and scheduler.params.warmup_max_lr (and warmup_min_lr "auto" -> 0).
  std::optional<double> learning_rate;
  std::optional<std::pair<double, double>> betas;  // optimizer.params.betas (adam_beta1/2)
  std::optional<double> eps;                       // optimizer.params.eps (adam_epsilon)
  std::optional<double> weight_decay;              // optimizer.params.weight_decay
  std::optional<double> gradient_clipping;         // gradient_clipping (HF max_grad_norm)
  std::optional<bool> fp16;                        // fp16.enabled
  std::optional<bool> bf16;                        // bf16.enabled
  std::optional<int64_t> warmup_steps;             // scheduler.params.warmup_num_steps
  std::optional<int64_t> total_steps;              // scheduler.params.total_num_steps
  // The model's hidden size h: zero_optimization.reduce_bucket_size = h*h,
  // stage3_prefetch_bucket_size = 0.9*h*h, stage3_param_persistence_threshold = 10*h.
  std::optional<int64_t> hidden_size;
  // false (HF): explicit config values must agree with the values above. true: the values only
  // fill "auto" keys (a program's defaults), explicit config values are kept.
  bool fill_only = false;
};

// Parses a JSON document. dp_world_size resolves the batch-size triple. Throws ConfigError.
// Warnings (unknown keys, deprecated aliases) go to `warnings` if given, else to stderr (on the
// calling rank; initialize() prints them on global rank 0 only).
Config parse_config(const nlohmann::json& doc, int dp_world_size,
                    const ConfigOverrides& overrides = {},
                    std::vector<std::string>* warnings = nullptr);

// Reads the file (error names the path and the JSON parse position), then parse_config.
Config load_config(const std::string& path, int dp_world_size,
                   const ConfigOverrides& overrides = {},
                   std::vector<std::string>* warnings = nullptr);

// Batch-size resolution alone: any two of the three give the third; all three are checked.
// Missing values are 0. Throws ConfigError printing all values and the world size.
struct BatchSizes {
  int64_t train_batch_size = 0;
  int64_t train_micro_batch_size_per_gpu = 0;
  int64_t gradient_accumulation_steps = 0;
};
BatchSizes resolve_batch_sizes(BatchSizes given, int dp_world_size);

}  // namespace deepspeed
