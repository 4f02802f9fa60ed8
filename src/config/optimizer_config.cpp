// "optimizer" and "scheduler" blocks. Their params stay JSON: src/optim turns them into typed
// hyper-parameters and names bad keys there; here only the shape and DeepSpeed's own rules.

#include "config/blocks.h"
#include "deepspeed/errors.h"
#include "optim/onebit_types.h"

namespace deepspeed::config {
namespace {

// Reads {"type": ..., "params": {...}}; returns false when the block is absent or null.
bool read_typed_block(ObjectReader& top, const std::string& key, std::string& type, json& params) {
  if (!top.has(key)) {
    top.find(key);
    return false;
  }
  ObjectReader block = top.child(key);
  block.read("type", type);
  if (type.empty()) fail(block.path_of("type"), json(type), "the name of the " + key);
  if (const json* p = block.find("params")) {
    if (!p->is_object()) fail(block.path_of("params"), *p, "a JSON object {...}");
    params = *p;
  }
  if (key == "optimizer") {
    bool legacy_fusion = false;  // a CUDA kernel choice in DeepSpeed; checked, not used
    block.read("legacy_fusion", legacy_fusion);
  }
  block.finish();
  return true;
}

}  // namespace

void read_optimizer(ObjectReader& top, Config& cfg) {
  OptimizerConfig opt;
  if (!read_typed_block(top, "optimizer", opt.type, opt.params)) return;
  // DeepSpeed refuses this key: clipping is the engine's job, configured once for all optimizers.
  if (opt.params.contains("max_grad_norm")) {
    throw ConfigError(
        "config key 'optimizer.params.max_grad_norm' is not supported; use the top-level "
        "\"gradient_clipping\" key instead (as DeepSpeed requires)");
  }
  cfg.optimizer = std::move(opt);
}

// What DeepSpeed's engine refuses (its _configure_optimizer / _configure_fp16_optimizer asserts),
// named with both keys; plus what deepspeed.cpp does not build (said so).
void check_optimizer_combination(const Config& cfg) {
  if (!cfg.optimizer) return;
  const std::string type = ascii_lower(cfg.optimizer->type);
  const int stage = cfg.zero_optimization.stage;
  const std::string stage_key =
      "zero_optimization.stage = " + std::to_string(stage) + " with optimizer.type \"" +
      cfg.optimizer->type + "\"";
  if (optim::is_onebit_optimizer(type)) {
    if (stage >= 1)
      throw ConfigError(stage_key + ": the 1-bit optimizers compress the data-parallel momentum "
                        "exchange and are not compatible with ZeRO (as in DeepSpeed); use stage 0");
  }
  if (type == "lamb" && stage == 3)
    throw ConfigError(stage_key + ": Lamb's trust ratio needs whole-parameter norms, which "
                      "deepspeed.cpp computes across ZeRO partitions at stages 1-2 but not over "
                      "stage 3's per-unit slices (not implemented); use stage 0, 1 or 2");
  // DeepSpeed's engine (_do_optimizer_sanity_check) asserts a dynamic loss scale for Lamb and
  // OneBitLamb. In fp32 that holds (fp16.loss_scale defaults to 0); bf16's scale is fixed at 1.
  // 1-bit Lamb in fp16 steps the flat fp32 master per segment (optim/onebit_lamb.h).
  if (type == "lamb" || type == "onebitlamb") {
    if (cfg.bf16.enabled)
      throw ConfigError("bf16.enabled = true with optimizer.type \"" + cfg.optimizer->type +
                        "\": DeepSpeed requires dynamic loss scaling for " + cfg.optimizer->type +
                        ", and bf16 has none (its scale is fixed at 1); use fp16 with "
                        "fp16.loss_scale = 0, or fp32");
    if (cfg.fp16.enabled && cfg.fp16.loss_scale != 0)
      throw ConfigError("fp16.loss_scale = " + std::to_string(cfg.fp16.loss_scale) +
                        " with optimizer.type \"" + cfg.optimizer->type +
                        "\": DeepSpeed requires dynamic loss scaling (fp16.loss_scale = 0) for " +
                        cfg.optimizer->type);
  }
}

void read_scheduler(ObjectReader& top, Config& cfg) {
  SchedulerConfig sched;
  if (!read_typed_block(top, "scheduler", sched.type, sched.params)) return;
  cfg.scheduler = std::move(sched);
}

}  // namespace deepspeed::config
