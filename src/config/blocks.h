// Readers of the blocks of ds_config.json. Each reads its keys from the top-level reader into
// Config, validates what it can check alone, and warns about unknown keys inside its block.
// Checks that span blocks live in validate_config (parse_config.cpp).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/json_reader.h"
#include "deepspeed/config.h"

namespace deepspeed::config {

// The Hugging Face "auto" placeholder (auto_values.cpp, hf_auto_fill.cpp, batch_size.cpp).
inline bool is_auto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

// train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps (batch_size.cpp).
// Also returns the keys that were "auto", so the caller can write the resolved values into raw.
std::vector<std::string> read_batch_sizes(ObjectReader& top, int dp_world_size,
                                          const ConfigOverrides& overrides, Config& cfg);

// optimizer, scheduler (optimizer_config.cpp).
void read_optimizer(ObjectReader& top, Config& cfg);
// DeepSpeed's refusals of optimizer types with ZeRO stages and precisions (Lamb, the 1-bit
// family). Runs after the zero_optimization, fp16 and bf16 blocks were read.
void check_optimizer_combination(const Config& cfg);
void read_scheduler(ObjectReader& top, Config& cfg);

// fp16, bf16 / bfloat16, data_types, communication_data_type (precision_config.cpp).
void read_precision(ObjectReader& top, Config& cfg);

// zero_optimization with offload_param / offload_optimizer (zero_config.cpp, offload_config.cpp).
void read_zero(ObjectReader& top, Config& cfg);
// True for the zero_optimization size knobs (bucket sizes, sub_group_size, the stage3_ limits,
// each spelling) where a leftover "auto" keeps the default with a warning, as DeepSpeed drops it.
bool auto_falls_back_to_default(const std::string& zero_key);
void read_offload(ObjectReader& zero, const std::string& key, bool is_param, OffloadConfig& out);
void validate_offload(const std::string& zero_path, ZeroConfig& zero, Warnings& warnings);

// aio, activation_checkpointing, pipeline, flops_profiler, tensorboard, csv_monitor,
// checkpoint, comms_logger, timers (feature_blocks.cpp).
void read_feature_blocks(ObjectReader& top, Config& cfg);
// A value of "pipeline.stages" by read_pipeline's rule: nullopt for "auto", else a count >= 1
// in any integer form to_int64 takes (4, 4.0, "4"); ConfigError naming `path` otherwise. Also
// used by initialize_pipeline, which needs the count before the config can be parsed.
std::optional<int64_t> pipeline_stage_count(const json& value, const std::string& path);

// Blocks for features not provided here (amp, wandb, comet, nebula, autotuning, compression,
// data efficiency, ...): a warning or a ConfigError when switched on; strict key checks for the
// ones DeepSpeed models with pydantic (unprovided_blocks.cpp).
void read_unprovided_blocks(ObjectReader& top);

// Top-level scalars (clipping, steps_per_print, seed, ...) and the recognised blocks that are
// kept only in raw (top_level.cpp).
void read_top_level_scalars(ObjectReader& top, Config& cfg);
// "comm_timeout_seconds" by parse_config's rule: an integer (by to_int64's forms) > 0; nullopt
// when absent or null. Also read by comm::resolve_timeout, before initialize() parses the whole
// config, so that the two cannot disagree about a value (top_level.cpp).
std::optional<int64_t> read_comm_timeout_seconds(ObjectReader& top);
// prescale_gradients / gradient_predivide_factor against ZeRO-2's reduce_scatter, refused as
// DeepSpeed asserts. Runs after zero_optimization and the top-level scalars were read.
void check_gradient_scaling(const Config& cfg);
// "sequence_parallel_size" (only 1: sequence parallelism is not provided) and
// "data_parallel_size" against the engine's data-parallel world size, before the batch triple is
// resolved with that size (top_level.cpp).
void check_parallel_sizes(ObjectReader& top, int dp_world_size);
void accept_recognised_blocks(ObjectReader& top);
// True for top-level blocks stored only in raw, whose contents are not checked.
bool is_raw_only_block(const std::string& key);

// Throws ConfigError listing every "auto" value that cannot be resolved (auto_values.cpp).
void reject_unresolved_auto(const json& doc);

// "auto" values filled from ConfigOverrides by Hugging Face's rules (hf_auto_fill.cpp): `doc` is
// changed in place; `filled` lists the keys and values written, `mismatches` the explicit values
// that disagree with the overrides (empty with fill_only).
struct AutoFillResult {
  std::vector<std::pair<std::string, json>> filled;
  std::vector<std::string> mismatches;
};
AutoFillResult fill_auto_values(json& doc, const ConfigOverrides& overrides);
// Throws ConfigError listing every mismatch, if any.
void reject_auto_mismatches(const AutoFillResult& result);

// "fp32" / "fp16" / "bf16" from the spellings DeepSpeed and PyTorch use; error names `path`.
std::string normalise_dtype(const json& value, const std::string& path);

}  // namespace deepspeed::config
