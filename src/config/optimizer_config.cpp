// "optimizer" and "scheduler" blocks. Their params stay JSON: src/optim turns them into typed
// hyper-parameters and names bad keys there; here only the shape and DeepSpeed's own rules.
#include "config/blocks.h"
#include "deepspeed/errors.h"

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

void read_scheduler(ObjectReader& top, Config& cfg) {
  SchedulerConfig sched;
  if (!read_typed_block(top, "scheduler", sched.type, sched.params)) return;
  cfg.scheduler = std::move(sched);
}

}  // namespace deepspeed::config
