// fp16, bf16 (block alias "bfloat16"), data_types and communication_data_type.
#include "config/blocks.h"
#include "deepspeed/errors.h"

namespace deepspeed::config {
namespace {

void read_fp16(ObjectReader& top, Fp16Config& fp16) {
  ObjectReader r = top.child("fp16");
  r.read("enabled", fp16.enabled);
  r.read("auto_cast", fp16.auto_cast);
  r.read("loss_scale", fp16.loss_scale);
  r.read("fp16_master_weights_and_grads", fp16.fp16_master_weights_and_grads);
  // The scaler arguments reach DeepSpeed's ZeRO scaler only if one of them is written.
  for (const char* k : {"initial_scale_power", "loss_scale_window", "hysteresis", "min_loss_scale",
                        "consecutive_hysteresis"}) {
    if (r.has(k)) fp16.dynamic_keys_given = true;
  }
  r.read("initial_scale_power", fp16.initial_scale_power);
  r.read("loss_scale_window", fp16.loss_scale_window);
  r.read("hysteresis", fp16.hysteresis);
  r.read("consecutive_hysteresis", fp16.consecutive_hysteresis);
  r.read("min_loss_scale", fp16.min_loss_scale);
  // apex AMP's setting, written into fp16 by some recipes (DeepSpeed-Chat); DeepSpeed's fp16
  // block does not read it. Said precisely rather than as an unknown key.
  if (r.has("opt_level")) {
    r.warnings().add("config key '" + r.path_of("opt_level") +
                     "' is not read by the fp16 block (it is apex AMP's amp.opt_level); it is "
                     "ignored, as in DeepSpeed");
  }
  r.find("opt_level");
  r.finish();
  // DeepSpeed reads it only from an enabled fp16 block.
  if (fp16.fp16_master_weights_and_grads && !fp16.enabled) {
    r.warnings().add("config key '" + r.path_of("fp16_master_weights_and_grads") +
                     "' is ignored: '" + r.path_of("enabled") + "' is false");
    fp16.fp16_master_weights_and_grads = false;
  }
  require_at_least(r.path_of("loss_scale"), fp16.loss_scale, 0);
  // 2^power must be a finite float scale; 2^63 is already far beyond any useful value.
  require_in_range(r.path_of("initial_scale_power"), fp16.initial_scale_power, 0, 63);
  require_at_least(r.path_of("loss_scale_window"), fp16.loss_scale_window, 1);
  require_at_least(r.path_of("hysteresis"), fp16.hysteresis, 1);
  // DeepSpeed reads it with a plain lookup and takes any number; 0 (DeepSpeed-Chat writes it)
  // means no floor of its own: the scale halves on every overflow, down to the smallest scale
  // whose inverse is finite in fp32 (precision/loss_scaler.h).
  require_at_least(r.path_of("min_loss_scale"), fp16.min_loss_scale, 0);
}

void read_bf16(ObjectReader& top, Bf16Config& bf16) {
  if (top.has("bf16") && top.has("bfloat16")) {
    throw ConfigError(
        "config keys 'bf16' and 'bfloat16' are both given; they are the same block, keep one");
  }
  const char* key = top.has("bfloat16") ? "bfloat16" : "bf16";
  top.accept({"bf16", "bfloat16"});
  ObjectReader r = top.child(key);
  r.read("enabled", bf16.enabled);
  r.read("immediate_grad_update", bf16.immediate_grad_update);
  r.read("check_grad_overflow", bf16.check_grad_overflow);
  r.read("bf16_master_weights_and_grads", bf16.bf16_master_weights_and_grads);
  r.read("bf16_optimizer_states", bf16.bf16_optimizer_states);
  r.finish();
  if (bf16.bf16_optimizer_states && !bf16.bf16_master_weights_and_grads) {
    throw ConfigError("config key '" + r.path_of("bf16_optimizer_states") +
                      "' is true but '" + r.path_of("bf16_master_weights_and_grads") +
                      "' is not: bf16 optimizer states need bf16 master weights (as DeepSpeed)");
  }
  if (bf16.bf16_master_weights_and_grads && !bf16.enabled) {
    r.warnings().add("config key '" + r.path_of("bf16_master_weights_and_grads") +
                     "' is ignored: '" + r.path_of("enabled") + "' is false");
    bf16.bf16_master_weights_and_grads = bf16.bf16_optimizer_states = false;
  }
}

}  // namespace

std::string normalise_dtype(const json& value, const std::string& path) {
  std::string s = ascii_lower(to_string(value, path));
  if (s == "fp32" || s == "float32" || s == "float") return "fp32";
  if (s == "fp16" || s == "float16" || s == "half") return "fp16";
  if (s == "bf16" || s == "bfloat16") return "bf16";
  fail(path, value, "one of \"fp32\", \"fp16\", \"bf16\" (or float32, float16, bfloat16)");
}

void read_precision(ObjectReader& top, Config& cfg) {
  read_fp16(top, cfg.fp16);
  read_bf16(top, cfg.bf16);
  if (cfg.fp16.enabled && cfg.bf16.enabled) {
    throw ConfigError(
        "config keys 'fp16.enabled' and 'bf16.enabled' are both true; enable at most one "
        "16-bit format");
  }
  if (const json* v = top.find("communication_data_type")) {
    cfg.communication_data_type = normalise_dtype(*v, "communication_data_type");
  }
  ObjectReader types = top.child("data_types");
  if (const json* v = types.find("grad_accum_dtype")) {
    cfg.grad_accum_dtype = normalise_dtype(*v, types.path_of("grad_accum_dtype"));
  }
  types.finish();
}

}  // namespace deepspeed::config
