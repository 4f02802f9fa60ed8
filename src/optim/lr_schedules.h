// The math of DeepSpeed's LR schedules (deepspeed/runtime/lr_schedules.py), as pure functions of
// t = last_batch_iteration. Each schedule returns one value per parameter group; writing them
// into an optimizer is ScheduledLR's job (lr_scheduler.cpp).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "deepspeed/config.h"

namespace deepspeed::optim {

enum class WarmupType { Log, Linear };

using Betas = std::pair<double, double>;

// Warm-up progress for t < W: ln(t+1)/ln(W) (log) or t/W (linear). REQUIRES: W >= 2.
double warmup_fraction(int64_t t, int64_t warmup_num_steps, WarmupType type);

class Schedule {
 public:
  virtual ~Schedule() = default;
  virtual std::string name() const = 0;
  // Written at construction (t = -1). Like DeepSpeed's zip() it may hold fewer entries than there
  // are groups; only the first ones are written (WarmupCosineLR writes [0.0]).
  virtual std::vector<double> initial_lr() const = 0;
  // REQUIRES: t >= 0.
  virtual std::vector<double> lr_at(int64_t t) const = 0;
  // Momentum cycling (OneCycle): (beta1, beta2) per group; beta2 is DeepSpeed's fixed 0.99.
  virtual bool cycles_momentum() const { return false; }
  virtual std::vector<Betas> initial_betas() const { return {}; }
  virtual std::vector<Betas> betas_at(int64_t t) const { return {}; }
};

// lr = min + (max - min) * γ(t); γ = warmup_fraction for t < W, 1 after. Init: min.
struct WarmupLR : Schedule {
  std::vector<double> min_lr{0.0};    // warmup_min_lr, per group
  std::vector<double> max_lr{0.001};  // warmup_max_lr, per group
  int64_t warmup_num_steps = 1000;    // W, clamped to >= 2 by the parser
  WarmupType warmup_type = WarmupType::Log;

  std::string name() const override { return "WarmupLR"; }
  std::vector<double> initial_lr() const override { return min_lr; }
  std::vector<double> lr_at(int64_t t) const override;
  virtual double gamma(int64_t t) const;
};

// WarmupLR, then γ = max(0, (T - t) / max(1, T - W)) for t >= W: linear decay to 0 at T.
struct WarmupDecayLR : WarmupLR {
  int64_t total_num_steps = 0;  // T

  std::string name() const override { return "WarmupDecayLR"; }
  double gamma(int64_t t) const override;
};

// lr = org_lr * ratio. t < W: ratio = r0 + (1 - r0) * warmup_fraction(t).
// t >= W: s = t - W + 1, S = T - W, ratio = max(0, c + (1 - c) * (1 + cos(pi * s / S)) / 2).
// Init writes [0.0]: only the first group's lr (DeepSpeed's quirk).
struct WarmupCosineLR : Schedule {
  std::vector<double> org_lr;       // the optimizer's lr per group at construction
  int64_t total_num_steps = 0;      // T >= W or the warm-up never ends; T == W: a step past T throws
  std::string total_key = "scheduler.params.total_num_steps";  // for that error
  double warmup_min_ratio = 0.0;    // r0
  int64_t warmup_num_steps = 1000;  // W, >= 2
  double cos_min_ratio = 0.0001;    // c
  WarmupType warmup_type = WarmupType::Log;

  std::string name() const override { return "WarmupCosineLR"; }
  std::vector<double> initial_lr() const override { return {0.0}; }
  std::vector<double> lr_at(int64_t t) const override;
  double ratio(int64_t t) const;
};

// One triangular cycle of first + second steps (lr up then down, beta1 down then up), then decay.
// i = t + 1, x = frac(i / total), scale = x / ratio if x <= ratio else (x - 1) / (ratio - 1).
// t < total: lr = min + (max - min) * scale, beta1 = max_mom - (max_mom - min_mom) * scale.
// t >= total, d = t - total + 1: lr = min / (1 + decay_lr_rate * d / decay_step_size) and
// beta1 = max_mom * (1 + decay_mom_rate * d / decay_step_size); each stays at min / max_mom when
// its rate or decay_step_size is 0. Init: lr = min, betas = (min_mom, 0.99).
struct OneCycle : Schedule {
  size_t num_groups = 1;
  double min_lr = 0.0;  // cycle_min_lr
  double max_lr = 0.0;  // cycle_max_lr
  double decay_lr_rate = 0.0;
  double first_step_size = 2000;   // cycle_first_step_size. REQUIRES: > 0
  double second_step_size = 2000;  // cycle_second_step_size (default: first). REQUIRES: >= 0
  double decay_step_size = 0;
  bool cycle_momentum = true;
  double min_mom = 0.8;  // cycle_min_mom
  double max_mom = 0.9;  // cycle_max_mom
  double decay_mom_rate = 0.0;

  std::string name() const override { return "OneCycle"; }
  std::vector<double> initial_lr() const override;
  std::vector<double> lr_at(int64_t t) const override;
  bool cycles_momentum() const override { return cycle_momentum; }
  std::vector<Betas> initial_betas() const override;
  std::vector<Betas> betas_at(int64_t t) const override;
  double scale(int64_t t) const;
  double lr_value(int64_t t) const;
  double beta1_value(int64_t t) const;
};

// lr = min_lr * (1 + step_rate * interval), interval = (t + 1) / step_size (floored if staircase).
struct LRRangeTest : Schedule {
  std::vector<double> min_lr{1e-3};  // lr_range_test_min_lr, per group
  double step_size = 2000;           // lr_range_test_step_size. REQUIRES: > 0
  double step_rate = 1.0;            // lr_range_test_step_rate
  bool staircase = false;            // lr_range_test_staircase

  std::string name() const override { return "LRRangeTest"; }
  std::vector<double> initial_lr() const override { return min_lr; }
  std::vector<double> lr_at(int64_t t) const override;
};

// A schedule parsed from the config plus the starting t (params.last_batch_iteration, default -1).
struct ParsedSchedule {
  std::unique_ptr<Schedule> schedule;
  int64_t last_batch_iteration = -1;
};

// Reads config.params for config.type. `group_lrs` is the optimizer's lr per group now (its size
// is the number of groups; WarmupCosineLR takes it as org_lr). Throws ConfigError; soft problems
// go to warn(warnings, ...).
ParsedSchedule parse_schedule(const SchedulerConfig& config, const std::vector<double>& group_lrs,
                              std::vector<std::string>* warnings);

std::vector<std::string> schedule_names();

}  // namespace deepspeed::optim
