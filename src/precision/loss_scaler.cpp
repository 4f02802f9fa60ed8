// Static and dynamic loss scalers; the update rules follow DeepSpeed's code line by line.
#include "precision/loss_scaler.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "deepspeed/errors.h"

namespace deepspeed::precision {
namespace {

constexpr double kScaleFactor = 2.0;

// The lowest scale the dynamic scalers go to, whatever fp16.min_loss_scale says (0 included):
// 2^-126, FLT_MIN. The engine divides the gradients by the scale in fp32; below this 1/scale
// overflows fp32 and a zero gradient times inf is NaN (DeepSpeed with min_loss_scale 0 would
// halve on toward 0.0 and then divide by zero).
constexpr double kSmallestScale = 0x1p-126;

// Where halving stops: fp16.min_loss_scale, but never under kSmallestScale.
double lowest_scale(double min_scale) { return std::max(min_scale, kSmallestScale); }

// DeepSpeed prints int(scale); a fractional floor (0.25) would then read as 0, so those keep
// their digits.
std::string format_scale(double s) {
  char buf[64];
  if (s >= 1.0 && s < 9.0e18 && std::floor(s) == s) {
    std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(s));
  } else {
    std::snprintf(buf, sizeof(buf), "%g", s);
  }
  return buf;
}

template <typename T>
T require_key(const nlohmann::json& state, const char* key) {
  if (!state.is_object() || !state.contains(key)) {
    throw CheckpointError(std::string("loss scaler state: missing key '") + key + "' in " +
                          state.dump());
  }
  try {
    return state.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw CheckpointError(std::string("loss scaler state: key '") + key +
                          "' has the wrong type: " + state.at(key).dump());
  }
}

void require_kind(const nlohmann::json& state, bool dynamic) {
  if (require_key<bool>(state, "dynamic") != dynamic) {
    throw CheckpointError(std::string("loss scaler state: saved from a ") +
                          (dynamic ? "static" : "dynamic") + " scaler, loading into a " +
                          (dynamic ? "dynamic" : "static") + " one");
  }
}

void require_positive(const char* key, double v) {
  if (!(v > 0) || !std::isfinite(v)) {
    throw ConfigError(std::string(key) + " = " + format_scale(v) + ": expected a finite value > 0");
  }
}

void require_non_negative(const char* key, double v) {
  if (!(v >= 0) || !std::isfinite(v)) {
    throw ConfigError(std::string(key) + " = " + format_scale(v) +
                      ": expected a finite value >= 0");
  }
}

void require_at_least_one(const char* key, int64_t v) {
  if (v < 1) throw ConfigError(std::string(key) + " = " + std::to_string(v) + ": expected >= 1");
}

const char* rule_name(ScaleRule r) {
  switch (r) {
    case ScaleRule::kZero:
      return "zero";
    case ScaleRule::kFp16Optimizer:
      return "fp16_optimizer";
    case ScaleRule::kFp16UnfusedOptimizer:
      return "fp16_unfused_optimizer";
  }
  return "?";
}

ScaleRule parse_rule(const std::string& s) {
  if (s == "zero") return ScaleRule::kZero;
  if (s == "fp16_optimizer") return ScaleRule::kFp16Optimizer;
  if (s == "fp16_unfused_optimizer") return ScaleRule::kFp16UnfusedOptimizer;
  throw CheckpointError("loss scaler state: unknown rule '" + s +
                        "' (expected \"zero\", \"fp16_optimizer\" or \"fp16_unfused_optimizer\")");
}

}  // namespace

// ---- static -------------------------------------------------------------------------------------

StaticLossScaler::StaticLossScaler(double scale) : scale_(scale) {
  require_positive("fp16.loss_scale", scale);
}

nlohmann::json StaticLossScaler::state_dict() const {
  return {{"dynamic", false}, {"cur_scale", scale_}};
}

void StaticLossScaler::load_state_dict(const nlohmann::json& state) {
  require_kind(state, false);
  scale_ = require_key<double>(state, "cur_scale");
}

// ---- dynamic ------------------------------------------------------------------------------------

DynamicLossScaler::DynamicLossScaler(double init_scale, int64_t scale_window, double min_scale,
                                     int hysteresis, bool consecutive_hysteresis, ScaleRule rule)
    : cur_scale_(init_scale),
      scale_window_(scale_window),
      min_scale_(min_scale),
      hysteresis_(hysteresis),
      consecutive_hysteresis_(consecutive_hysteresis),
      rule_(rule),
      cur_hysteresis_(hysteresis) {
  require_positive("fp16 initial loss scale (2^fp16.initial_scale_power)", init_scale);
  require_at_least_one("fp16.loss_scale_window", scale_window);
  require_non_negative("fp16.min_loss_scale", min_scale);
  require_at_least_one("fp16.hysteresis", hysteresis);
}

void DynamicLossScaler::update(bool overflow) {
  last_message_.clear();
  if (rule_ == ScaleRule::kZero) {
    update_zero(overflow);
  } else {
    update_fp16_optimizer(overflow);
  }
  cur_iter_ += 1;
}

// DynamicLossScaler.update_scale (runtime/fp16/loss_scaler.py).
void DynamicLossScaler::update_zero(bool overflow) {
  if (overflow) {
    if (hysteresis_ == 1 || cur_hysteresis_ == 1) {
      if (cur_scale_ == lowest_scale(min_scale_)) {
        std::string why =
            "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.";
        if (min_scale_ < kSmallestScale)
          why += " (fp16.min_loss_scale = " + format_scale(min_scale_) + ": the scale stops at " +
                 format_scale(kSmallestScale) +
                 ", 2^-126, the smallest whose inverse is finite in fp32)";
        throw Error(why);
      }
      const double next = std::max(cur_scale_ / kScaleFactor, lowest_scale(min_scale_));
      last_message_ = "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: " +
                      format_scale(cur_scale_) + ", reducing to " + format_scale(next);
      cur_scale_ = next;
    } else {
      last_message_ = "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: " +
                      format_scale(cur_scale_) + ", but hysteresis is " +
                      std::to_string(cur_hysteresis_) + ". Reducing hysteresis to " +
                      std::to_string(cur_hysteresis_ - 1);
      cur_hysteresis_ -= 1;
    }
    last_overflow_iter_ = cur_iter_;
    return;
  }
  if (consecutive_hysteresis_) cur_hysteresis_ = hysteresis_;
  if ((cur_iter_ - last_overflow_iter_) % scale_window_ == 0) {
    if (!consecutive_hysteresis_) cur_hysteresis_ = hysteresis_;
    cur_scale_ *= kScaleFactor;
  }
}

// FP16_Optimizer._update_scale (runtime/fp16/fused_optimizer.py).
void DynamicLossScaler::update_fp16_optimizer(bool overflow) {
  if (overflow) {
    const double next = std::max(cur_scale_ / kScaleFactor, lowest_scale(min_scale_));
    // Each wrapper's own line: fused_optimizer.py's and unfused_optimizer.py's step().
    const char* what = rule_ == ScaleRule::kFp16UnfusedOptimizer
                           ? "[deepspeed] fp16 dynamic loss scale overflow! Skipping step."
                           : "Overflow detected. Skipping step.";
    last_message_ = std::string(what) + " Attempted loss scale: " + format_scale(cur_scale_) +
                    ", reducing to " + format_scale(next);
    cur_scale_ = next;
    last_overflow_iter_ = cur_iter_;
    return;
  }
  const int64_t stable = cur_iter_ - last_overflow_iter_ - 1;
  if (stable > 0 && stable % scale_window_ == 0) cur_scale_ *= kScaleFactor;
}

nlohmann::json DynamicLossScaler::state_dict() const {
  return {{"dynamic", true},
          {"rule", rule_name(rule_)},
          {"cur_scale", cur_scale_},
          {"cur_iter", cur_iter_},
          {"last_overflow_iter", last_overflow_iter_},
          {"cur_hysteresis", cur_hysteresis_},
          {"scale_factor", kScaleFactor},
          {"scale_window", scale_window_},
          {"min_scale", min_scale_},
          {"delayed_shift", hysteresis_},
          {"consecutive_hysteresis", consecutive_hysteresis_}};
}

void DynamicLossScaler::load_state_dict(const nlohmann::json& state) {
  require_kind(state, true);
  // Build the whole replacement first so a bad state leaves this scaler untouched.
  try {
    DynamicLossScaler next(
        require_key<double>(state, "cur_scale"), require_key<int64_t>(state, "scale_window"),
        require_key<double>(state, "min_scale"), require_key<int>(state, "delayed_shift"),
        require_key<bool>(state, "consecutive_hysteresis"),
        parse_rule(require_key<std::string>(state, "rule")));
    next.cur_iter_ = require_key<int64_t>(state, "cur_iter");
    next.last_overflow_iter_ = require_key<int64_t>(state, "last_overflow_iter");
    next.cur_hysteresis_ = require_key<int>(state, "cur_hysteresis");
    *this = std::move(next);
  } catch (const ConfigError& e) {
    throw CheckpointError(std::string("loss scaler state: ") + e.what());
  }
}

// ---- factories ----------------------------------------------------------------------------------

std::unique_ptr<LossScaler> make_loss_scaler(const Fp16Config& fp16, Fp16Wrapper wrapper) {
  if (!fp16.enabled) return std::make_unique<StaticLossScaler>(1.0);
  if (fp16.loss_scale > 0) return std::make_unique<StaticLossScaler>(fp16.loss_scale);
  const double configured = std::ldexp(1.0, fp16.initial_scale_power);
  const bool given = fp16.dynamic_keys_given;
  if (wrapper == Fp16Wrapper::kZero) {
    if (!given) {
      return std::make_unique<DynamicLossScaler>(std::ldexp(1.0, 32), 1000, 1.0, 1, false);
    }
    return std::make_unique<DynamicLossScaler>(configured, fp16.loss_scale_window,
                                               fp16.min_loss_scale, fp16.hysteresis,
                                               fp16.consecutive_hysteresis);
  }
  // FP16_Optimizer takes its initial scale from initial_scale_power either way (default 16);
  // FP16_UnfusedOptimizer's own default floor is 0.25 where FP16_Optimizer's is 1.
  const double default_min = wrapper == Fp16Wrapper::kUnfused ? 0.25 : 1.0;
  return std::make_unique<DynamicLossScaler>(
      configured, given ? fp16.loss_scale_window : 1000,
      given ? fp16.min_loss_scale : default_min, 1, false,
      wrapper == Fp16Wrapper::kUnfused ? ScaleRule::kFp16UnfusedOptimizer
                                       : ScaleRule::kFp16Optimizer);
}

std::unique_ptr<LossScaler> loss_scaler_from_state_dict(const nlohmann::json& state) {
  std::unique_ptr<LossScaler> s;
  if (require_key<bool>(state, "dynamic")) {
    s = std::make_unique<DynamicLossScaler>(1.0, 1, 1.0, 1, false);
  } else {
    s = std::make_unique<StaticLossScaler>(1.0);
  }
  s->load_state_dict(state);
  return s;
}

bool has_inf_or_nan(const at::Tensor& t) {
  if (t.numel() == 0 || !t.is_floating_point()) return false;
  // One reduction pass, no temporaries: an inf or NaN anywhere makes the sum inf or NaN, so a
  // finite sum proves there is none (DeepSpeed's own test). The converse fails when finite values
  // overflow the sum, so a non-finite sum (rare: overflow steps) is confirmed element-wise.
  const auto acc = t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  if (std::isfinite(t.sum(acc).item<double>())) return false;
  return !t.isfinite().all().item<bool>();
}

}  // namespace deepspeed::precision
