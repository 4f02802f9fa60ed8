// Learning-rate schedules of DeepSpeed's `"scheduler"` block: WarmupLR, WarmupDecayLR,
// WarmupCosineLR, OneCycle, LRRangeTest, with DeepSpeed's exact formulas and quirks
// (docs/config.md lists them).
//
// A scheduler keeps t = last_batch_iteration, -1 after construction. step() is called once per
// optimizer step that was not skipped (the engine does this at accumulation boundaries): it
// increments t and writes lr (and, for OneCycle, momentum) into every parameter group of its
// target. Construction with last_batch_iteration == -1 already writes the initial values.
//
// The scheduler writes through LRTarget, so it drives torch::optim optimizers (lr_target_for) and
// the engine's own ZeRO optimizers alike. Not thread-safe.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "deepspeed/config.h"

namespace torch::optim {
class Optimizer;
}

namespace deepspeed {

// Where a scheduler writes: the parameter groups of an optimizer.
class LRTarget {
 public:
  virtual ~LRTarget() = default;
  virtual size_t num_groups() const = 0;
  virtual double lr(size_t group) const = 0;
  virtual void set_lr(size_t group, double lr) = 0;

  // Adam-family optimizers: (beta1, beta2) per group. OneCycle cycles beta1 and sets beta2 = 0.99.
  virtual bool has_betas() const { return false; }
  virtual std::pair<double, double> betas(size_t group) const;
  virtual void set_betas(size_t group, std::pair<double, double> betas);

  // SGD-style momentum per group. OneCycle leaves it alone (it cycles betas only, as DeepSpeed).
  virtual bool has_momentum() const { return false; }
  virtual double momentum(size_t group) const;
  virtual void set_momentum(size_t group, double momentum);
};

// Adapter over a libtorch optimizer's param_groups (betas for Adam/AdamW, momentum for SGD).
// The first form keeps the optimizer alive; the second REQUIRES that it outlives the target.
std::shared_ptr<LRTarget> lr_target_for(std::shared_ptr<torch::optim::Optimizer> optimizer);
std::shared_ptr<LRTarget> lr_target_for(torch::optim::Optimizer& optimizer);

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  // DeepSpeed's class name: "WarmupLR", "OneCycle", ...
  virtual std::string name() const = 0;
  // One optimizer step: t += 1, then writes the lr (and momentum) for t into the target.
  virtual void step() = 0;
  // Throws ConfigError, changing nothing, when the next step() would (a schedule past its end,
  // e.g. WarmupCosineLR whose total equals its warm-up). The engine asks before it applies an
  // update, so a step the schedule cannot take is refused whole, not after the weights changed.
  virtual void check_next_step() const {}
  // The lr of every group as last written (read back from the target), like get_last_lr().
  virtual std::vector<double> get_lr() const = 0;
  // beta1 (or SGD momentum) of every group as last written; empty when momentum is not cycled.
  virtual std::vector<double> get_mom() const = 0;
  virtual int64_t last_batch_iteration() const = 0;
  // {"last_batch_iteration": t}, as DeepSpeed saves it.
  virtual nlohmann::json state_dict() const = 0;
  // Restores t and writes the lr (and momentum) for t into the target, so a resumed run continues
  // with the right values even when the optimizer's own state does not carry them.
  // Throws CheckpointError when "last_batch_iteration" is missing or not an integer.
  virtual void load_state_dict(const nlohmann::json& state) = 0;
  // Throws (CheckpointError, or ConfigError for a t the schedule cannot take), changing nothing,
  // when load_state_dict(state) would throw. load_checkpoint asks while it checks the checkpoint,
  // before it changes anything, so a mismatched scheduler state is refused whole instead of
  // leaving the engine half loaded. The default accepts every state: a client scheduler whose
  // load_state_dict can refuse one should override it.
  virtual void check_state_dict(const nlohmann::json& state) const { (void)state; }
};

// Builds the scheduler named by config.type (case-insensitive) over `target`.
// Throws ConfigError for an unknown type (the message lists the supported names), a missing
// required parameter, a wrong type or a per-group list whose length is not target->num_groups(),
// naming the key as scheduler.params.<key>. Unknown keys and DeepSpeed's soft problems
// (total_num_steps < warmup_num_steps, unknown warmup_type) are warnings: appended to `warnings`
// when given, else printed to stderr.
std::shared_ptr<LRScheduler> make_lr_scheduler(const SchedulerConfig& config,
                                               std::shared_ptr<LRTarget> target,
                                               std::vector<std::string>* warnings = nullptr);

// The names make_lr_scheduler accepts.
std::vector<std::string> supported_lr_schedulers();

}  // namespace deepspeed
