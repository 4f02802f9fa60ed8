// parse_config: the document → Config, block by block, then checks that span blocks.
#include "config/blocks.h"
#include "deepspeed/config.h"
#include "deepspeed/errors.h"

namespace deepspeed {
namespace {

// DeepSpeed turns the wall-clock timers on whenever the flops profiler is on.
void apply_implied_settings(Config& cfg) {
  if (cfg.flops_profiler.enabled) cfg.wall_clock_breakdown = true;
}

}  // namespace

Config parse_config(const nlohmann::json& doc, int dp_world_size, const ConfigOverrides& overrides,
                    std::vector<std::string>* warnings) {
  if (!doc.is_object()) {
    throw ConfigError("the DeepSpeed config must be a JSON object {...}, got " +
                      config::describe(doc));
  }
  config::reject_invalid_utf8(doc);  // a config built in code skips the file reader's check
  nlohmann::json filled = doc;
  config::AutoFillResult fill = config::fill_auto_values(filled, overrides);
  config::reject_auto_mismatches(fill);
  config::reject_unresolved_auto(filled);
  config::Warnings sink(warnings);
  config::ObjectReader top(filled, "", sink);
  Config cfg;
  config::check_parallel_sizes(top, dp_world_size);
  std::vector<std::string> auto_batch_keys =
      config::read_batch_sizes(top, dp_world_size, overrides, cfg);
  config::read_optimizer(top, cfg);
  config::read_scheduler(top, cfg);
  config::read_precision(top, cfg);
  config::read_zero(top, cfg);
  config::check_optimizer_combination(cfg);
  config::read_feature_blocks(top, cfg);
  config::read_unprovided_blocks(top);
  config::read_top_level_scalars(top, cfg);
  config::check_gradient_scaling(cfg);
  config::accept_recognised_blocks(top);
  top.finish();
  apply_implied_settings(cfg);

  cfg.raw = filled;
  cfg.auto_filled = std::move(fill.filled);
  // raw records what training used: "auto" batch keys carry their resolved values.
  for (const std::string& key : auto_batch_keys) {
    if (key == "train_batch_size") cfg.raw[key] = cfg.train_batch_size;
    if (key == "train_micro_batch_size_per_gpu") cfg.raw[key] = cfg.train_micro_batch_size_per_gpu;
    if (key == "gradient_accumulation_steps") cfg.raw[key] = cfg.gradient_accumulation_steps;
    cfg.auto_filled.emplace_back(key, cfg.raw[key]);
  }
  return cfg;
}

}  // namespace deepspeed
