// Top-level scalar keys, and the top-level blocks DeepSpeed knows that deepspeed.cpp keeps only
// in Config::raw (their features are not provided; they are accepted so real configs load).
#include <set>

#include "config/blocks.h"

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
                                                "timers",
                                                "compile",
                                                "monitor_config"};
  return kBlocks;
}

// Legacy or niche scalars: type-checked, otherwise unused.
void read_unused_scalars(ObjectReader& top) {
  bool flag = false;
  for (const char* k : {"sparse_gradients", "disable_allgather", "graph_harvesting",
                        "use_data_before_expert_parallelism"}) {
    top.read(k, flag);
  }
  int64_t count = 0;
  for (const char* k : {"vocabulary_size", "sequence_parallel_size", "data_parallel_size"}) {
    top.read_count(k, count);
  }
  if (const json* v = top.find("seq_parallel_comm_data_type")) {
    normalise_dtype(*v, "seq_parallel_comm_data_type");
  }
  // Only meaningful with the legacy boolean "zero_optimization" form (read there).
  top.read_count("allgather_size", count);
}

}  // namespace

bool is_raw_only_block(const std::string& key) { return raw_only_blocks().count(key) > 0; }

void accept_recognised_blocks(ObjectReader& top) {
  top.accept(std::vector<std::string>(raw_only_blocks().begin(), raw_only_blocks().end()));
}

void read_top_level_scalars(ObjectReader& top, Config& cfg) {
  top.read("gradient_clipping", cfg.gradient_clipping);
  require_at_least("gradient_clipping", cfg.gradient_clipping, 0);
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
  top.read("comm_timeout_seconds", cfg.comm_timeout_seconds);
  require_positive("comm_timeout_seconds", static_cast<double>(cfg.comm_timeout_seconds));
  top.read("comms_check", cfg.comms_check);
  read_unused_scalars(top);
}

}  // namespace deepspeed::config
