// Top-level scalar keys, and the top-level blocks DeepSpeed knows that deepspeed.cpp keeps only
// in Config::raw (their features are not provided; they are accepted so real configs load).
#include <set>
#include <sstream>

#include "config/blocks.h"
#include "deepspeed/errors.h"

namespace deepspeed::config {
namespace {

const std::set<std::string>& raw_only_blocks() {
  static const std::set<std::string> kBlocks = {"amp",
                                                "wandb",
                                                "comet",
                                                "sparse_attention",
                                                "elasticity",
                                                "autotuning",
                                                "compression_training",
                                                "progressive_layer_drop",
                                                "curriculum_learning",
                                                "data_efficiency",
                                                "hybrid_engine",
                                                "tensor_parallel",
                                                "weight_quantization",
                                                "quantize_training",
                                                "eigenvalue",
                                                "nebula",
                                                "compile",
                                                "monitor_config"};
  return kBlocks;
}

// DeepSpeed 0.16 reads "seq_parallel_comm_data_type"; later releases read
// "seq_parallel_communication_data_type", the spelling DeepSpeed's own format string for the key
// has always shown. Both are the same setting; the two at once are ambiguous.
void read_seq_parallel_dtype(ObjectReader& top) {
  const char* kNames[] = {"seq_parallel_comm_data_type", "seq_parallel_communication_data_type"};
  if (top.has(kNames[0]) && top.has(kNames[1])) {
    throw ConfigError(std::string("config keys '") + kNames[0] + "' and '" + kNames[1] +
                      "' are the same setting; give only one");
  }
  for (const char* key : kNames) {
    if (const json* v = top.find(key)) normalise_dtype(*v, key);
  }
}

// Legacy or niche scalars: type-checked, otherwise unused.
void read_unused_scalars(ObjectReader& top) {
  bool flag = false;
  for (const char* k : {"sparse_gradients", "disable_allgather", "graph_harvesting",
                        "use_data_before_expert_parallelism"}) {
    top.read(k, flag);
  }
  int64_t count = 0;
  top.read_count("vocabulary_size", count);
  read_seq_parallel_dtype(top);
  // Only meaningful with the legacy boolean "zero_optimization" form (read there).
  top.read_count("allgather_size", count);
}

}  // namespace

// DeepSpeed's initialize() builds a (data_parallel_size, sequence_parallel_size) device mesh when
// the config holds both keys, and its batch triple then uses the mesh's data-parallel group size;
// with sequence_parallel_size alone it uses world size / sequence_parallel_size. Either way the
// batch would resolve against another data-parallel size than the one this engine trains with.
void check_parallel_sizes(ObjectReader& top, int dp_world_size) {
  const bool has_sp = top.has("sequence_parallel_size");
  int64_t sp = 1;
  top.read_count("sequence_parallel_size", sp);
  if (sp != 1) {
    throw ConfigError("config key 'sequence_parallel_size' is " + std::to_string(sp) +
                      ": sequence parallelism (DeepSpeed-Ulysses) is not provided by "
                      "deepspeed.cpp; remove the key or set it to 1");
  }
  int64_t dp = 0;
  if (!top.has("data_parallel_size")) {
    top.find("data_parallel_size");  // null: known, nothing to check
    return;
  }
  top.read_count("data_parallel_size", dp);
  if (dp == dp_world_size) return;
  const std::string values = "config key 'data_parallel_size' is " + std::to_string(dp) +
                             " but the data-parallel world size is " +
                             std::to_string(dp_world_size);
  if (has_sp) {
    throw ConfigError(values + " (world size / (pipeline stages * tensor-parallel size)); "
                      "with 'sequence_parallel_size' DeepSpeed builds its device mesh from this "
                      "value and resolves the batch sizes with it. Set it to " +
                      std::to_string(dp_world_size) + " or remove it");
  }
  // Without sequence_parallel_size DeepSpeed builds no mesh and ignores the key.
  top.warnings().add(values + "; without 'sequence_parallel_size' DeepSpeed ignores it, and so "
                     "does deepspeed.cpp (the batch sizes use " + std::to_string(dp_world_size) +
                     ")");
}

bool is_raw_only_block(const std::string& key) { return raw_only_blocks().count(key) > 0; }

void accept_recognised_blocks(ObjectReader& top) {
  top.accept(std::vector<std::string>(raw_only_blocks().begin(), raw_only_blocks().end()));
}

void read_top_level_scalars(ObjectReader& top, Config& cfg) {
  // Any real: DeepSpeed clips only when it is > 0, so 0 and negative values (-1 in some configs)
  // are off, as in engine.cpp.
  top.read("gradient_clipping", cfg.gradient_clipping);
  top.read("prescale_gradients", cfg.prescale_gradients);
  top.read("gradient_predivide_factor", cfg.gradient_predivide_factor);
  require_positive("gradient_predivide_factor", cfg.gradient_predivide_factor);
  top.read_count("steps_per_print", cfg.steps_per_print);
  top.read("wall_clock_breakdown", cfg.wall_clock_breakdown);
  top.read("memory_breakdown", cfg.memory_breakdown);
  top.read("dump_state", cfg.dump_state);
  top.read("dataloader_drop_last", cfg.dataloader_drop_last);
  top.read("zero_allow_untested_optimizer", cfg.zero_allow_untested_optimizer);
  top.read("zero_force_ds_cpu_optimizer", cfg.zero_force_ds_cpu_optimizer);
  top.read("seed", cfg.seed);
  if (auto seconds = read_comm_timeout_seconds(top)) cfg.comm_timeout_seconds = *seconds;
  top.read("comms_check", cfg.comms_check);
  read_unused_scalars(top);
}

std::optional<int64_t> read_comm_timeout_seconds(ObjectReader& top) {
  if (!top.has("comm_timeout_seconds")) {
    top.find("comm_timeout_seconds");  // null: known, keeps the default
    return std::nullopt;
  }
  int64_t seconds = 0;
  top.read("comm_timeout_seconds", seconds);
  require_positive(top.path_of("comm_timeout_seconds"), static_cast<double>(seconds));
  return seconds;
}

void check_gradient_scaling(const Config& cfg) {
  const ZeroConfig& z = cfg.zero_optimization;
  // DeepSpeed's ZeRO-1/2 optimizer asserts both when `reduce_scatter and partition_gradients`,
  // i.e. at stage 2 with reduce_scatter on ("... is not yet supported with ZeRO-2 with reduce
  // scatter enabled"). Stages 0, 1 and 3 scale as asked.
  if (z.stage != 2 || !z.reduce_scatter) return;
  auto refuse = [](const std::string& key, const std::string& value, const char* deepspeed_needs) {
    const std::string advice =
        "; set zero_optimization.reduce_scatter to false, or drop '" + key + "'";
    throw ConfigError("config key '" + key + "' is " + value +
                      " with ZeRO stage 2 and 'zero_optimization.reduce_scatter' true (the "
                      "default): DeepSpeed's ZeRO-2 refuses the combination (it needs " +
                      deepspeed_needs + " with reduce_scatter)" + advice);
  };
  if (cfg.prescale_gradients) {
    refuse("prescale_gradients", "true", "post-scaled gradients");
  }
  if (cfg.gradient_predivide_factor != 1.0) {
    std::ostringstream factor;
    factor << cfg.gradient_predivide_factor;
    refuse("gradient_predivide_factor", factor.str(), "gradient_predivide_factor 1.0");
  }
}

}  // namespace deepspeed::config
