// Loss scaling for fp16 training, as DeepSpeed does it (runtime/fp16/loss_scaler.py for ZeRO,
// FP16_Optimizer._update_scale for the non-ZeRO path).
//
// The engine multiplies the loss by scale() before backward, divides the gradients by it before
// the optimizer step, and calls update(overflow) exactly once per optimizer step with the
// overflow flag already agreed by every rank (MAX all-reduce over DP and MP). An overflowed step
// is skipped by the engine; the scaler only moves the scale.
//
// Thread-safety: none; one scaler per engine, used from the training thread.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "deepspeed/config.h"

namespace deepspeed::precision {

class LossScaler {
 public:
  virtual ~LossScaler() = default;
  virtual double scale() const = 0;
  // Once per optimizer step (not per micro-step). May throw deepspeed::Error (dynamic, at floor).
  virtual void update(bool overflow) = 0;
  virtual bool dynamic() const = 0;
  // Everything needed to continue the identical scale sequence after a restart.
  virtual nlohmann::json state_dict() const = 0;
  // Throws CheckpointError naming the key when the state is of the other kind or incomplete.
  virtual void load_state_dict(const nlohmann::json& state) = 0;
  // What DeepSpeed would log on rank 0 about the last update(); empty when nothing to say.
  const std::string& last_message() const { return last_message_; }

 protected:
  std::string last_message_;
};

// fp16.loss_scale > 0: the scale never moves.
class StaticLossScaler final : public LossScaler {
 public:
  // REQUIRES: scale > 0 (ConfigError otherwise).
  explicit StaticLossScaler(double scale);
  double scale() const override { return scale_; }
  void update(bool overflow) override { last_message_.clear(); }
  bool dynamic() const override { return false; }
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;

 private:
  double scale_;
};

// Which of DeepSpeed's two dynamic rules runs.
enum class ScaleRule {
  // ZeRO 1/2/3 (DynamicLossScaler): hysteresis; doubles when
  // (cur_iter - last_overflow_iter) % window == 0; throws when asked to go under min_scale.
  kZero,
  // FP16_Optimizer without ZeRO: no hysteresis; doubles when stable = cur_iter -
  // last_overflow_iter - 1 is > 0 and a multiple of window (one step later than kZero); at the
  // floor it stays there silently.
  kFp16Optimizer,
  // FP16_UnfusedOptimizer: kFp16Optimizer's rule, logged with that wrapper's own overflow line.
  kFp16UnfusedOptimizer,
};

class DynamicLossScaler final : public LossScaler {
 public:
  // REQUIRES: init_scale > 0, scale_window >= 1, min_scale >= 0, hysteresis >= 1 (ConfigError
  // naming the fp16.* key otherwise). hysteresis and consecutive_hysteresis matter for kZero only.
  // Halving stops at max(min_scale, 2^-126): under 2^-126 the inverse the gradients are
  // multiplied by overflows fp32, so min_scale 0 (DeepSpeed's "no floor") stops there.
  DynamicLossScaler(double init_scale, int64_t scale_window, double min_scale, int hysteresis,
                    bool consecutive_hysteresis, ScaleRule rule = ScaleRule::kZero);

  double scale() const override { return cur_scale_; }
  void update(bool overflow) override;
  bool dynamic() const override { return true; }
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;

  int64_t cur_iter() const { return cur_iter_; }
  int64_t last_overflow_iter() const { return last_overflow_iter_; }
  int cur_hysteresis() const { return cur_hysteresis_; }
  int64_t scale_window() const { return scale_window_; }
  double min_scale() const { return min_scale_; }
  int hysteresis() const { return hysteresis_; }
  bool consecutive_hysteresis() const { return consecutive_hysteresis_; }
  ScaleRule rule() const { return rule_; }

 private:
  void update_zero(bool overflow);
  void update_fp16_optimizer(bool overflow);

  double cur_scale_;
  int64_t scale_window_;
  double min_scale_;
  int hysteresis_;  // DeepSpeed's delayed_shift
  bool consecutive_hysteresis_;
  ScaleRule rule_;
  int64_t cur_iter_ = 0;
  int64_t last_overflow_iter_ = -1;
  int cur_hysteresis_;
};

// The optimizer wrapper DeepSpeed's engine builds for fp16 (_configure_fp16_optimizer): each
// has its own scaler defaults.
enum class Fp16Wrapper {
  kZero,      // ZeRO stage >= 1
  kFused,     // no ZeRO, FP16_Optimizer: FusedAdam (Adam/AdamW without torch_adam), 1-bit Adams
  kUnfused,   // no ZeRO, FP16_UnfusedOptimizer: every other optimizer, a client's included
};

// The scaler DeepSpeed would build for this fp16 block:
//   fp16.loss_scale > 0   → static scale;
//   dynamic, kZero        → kZero with the five fp16 keys if any was written
//                           (dynamic_keys_given), else 2^32, window 1000, min 1, hysteresis 1;
//   dynamic, no ZeRO      → kFp16Optimizer with 2^initial_scale_power, window and min if any key
//                           was written, else 2^16, 1000 and min 1 (kFused) or 0.25 (kUnfused)
//                           (hysteresis is not supported on that path).
// fp16 disabled (fp32 or bf16): a static scale of 1, so the engine's step reads the same.
std::unique_ptr<LossScaler> make_loss_scaler(const Fp16Config& fp16, Fp16Wrapper wrapper);

// A scaler of whichever kind `state` was saved from (DeepSpeed restores the pickled scaler
// object itself, so the checkpoint's kind and settings win over the config's).
std::unique_ptr<LossScaler> loss_scaler_from_state_dict(const nlohmann::json& state);

// Any inf or NaN in t (any dtype, any device; false for an empty or integer tensor). One sum over
// t in the common case; an element-wise confirmation only when the sum is not finite. Synchronises
// with the device to read the answer.
bool has_inf_or_nan(const at::Tensor& t);

}  // namespace deepspeed::precision
