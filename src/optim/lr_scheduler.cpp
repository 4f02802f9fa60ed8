// ScheduledLR: steps t and writes a Schedule's values into an LRTarget; the scheduler factory.
#include "deepspeed/lr_scheduler.h"

#include <algorithm>

#include "deepspeed/errors.h"
#include "optim/lr_schedules.h"
#include "optim/param_reader.h"

namespace deepspeed {
namespace optim {
namespace {

class ScheduledLR : public LRScheduler {
 public:
  ScheduledLR(std::unique_ptr<Schedule> schedule, std::shared_ptr<LRTarget> target, int64_t t,
              std::vector<std::string>* warnings)
      : schedule_(std::move(schedule)), target_(std::move(target)), t_(t) {
    cycle_betas_ = choose_cycle_betas(warnings);
    if (t_ == -1) {
      write_lr(schedule_->initial_lr());
      if (cycle_betas_) write_betas(schedule_->initial_betas());
    }
  }

  std::string name() const override { return schedule_->name(); }

  // The values for t + 1 are computed before t moves: a schedule that throws leaves t as it was.
  void step() override {
    write_lr_and_betas(t_ + 1);
    ++t_;
  }

  void check_next_step() const override { (void)schedule_->lr_at(t_ + 1); }

  std::vector<double> get_lr() const override {
    std::vector<double> out;
    for (size_t g = 0; g < target_->num_groups(); ++g) out.push_back(target_->lr(g));
    return out;
  }

  std::vector<double> get_mom() const override {
    std::vector<double> out;
    if (!cycle_betas_) return out;  // DeepSpeed's get_mom() returns None then
    for (size_t g = 0; g < target_->num_groups(); ++g) out.push_back(target_->betas(g).first);
    return out;
  }

  int64_t last_batch_iteration() const override { return t_; }

  nlohmann::json state_dict() const override { return {{"last_batch_iteration", t_}}; }

  void check_state_dict(const nlohmann::json& state) const override {
    const int64_t t = saved_iteration(state);
    // A t the schedule cannot take (WarmupCosineLR past its end) throws here, not at the load.
    if (t >= 0) (void)values_at(t);
  }

  void load_state_dict(const nlohmann::json& state) override {
    const int64_t t = saved_iteration(state);
    if (t >= 0) {
      write_lr_and_betas(t);  // throws before anything is written
    } else {
      write_lr(schedule_->initial_lr());
      if (cycle_betas_) write_betas(schedule_->initial_betas());
    }
    t_ = t;
  }

 private:
  // DeepSpeed 0.16.5 cycles momentum only through `betas`: an optimizer without them (SGD,
  // Adagrad) keeps its own momentum, with this warning, so a config trains the same in both.
  bool choose_cycle_betas(std::vector<std::string>* warnings) const {
    if (!schedule_->cycles_momentum()) return false;
    if (target_->has_betas()) return true;
    warn(warnings,
         "scheduler.params.cycle_momentum: cycle_momentum is disabled because the optimizer does "
         "not support momentum, no betas attribute in defaults" +
             std::string(target_->has_momentum()
                             ? " (its SGD momentum is left as configured, as in DeepSpeed)"
                             : ""));
    return false;
  }

  // The saved t: "last_batch_iteration", an integer >= -1.
  static int64_t saved_iteration(const nlohmann::json& state) {
    auto it = state.is_object() ? state.find("last_batch_iteration") : state.end();
    if (it == state.end() || !it->is_number_integer() || it->get<int64_t>() < -1) {
      throw CheckpointError(
          "lr_scheduler state: expected an integer \"last_batch_iteration\" >= -1, got " +
          state.dump());
    }
    return it->get<int64_t>();
  }

  std::pair<std::vector<double>, std::vector<Betas>> values_at(int64_t t) const {
    return {schedule_->lr_at(t), cycle_betas_ ? schedule_->betas_at(t) : std::vector<Betas>{}};
  }

  // Computes both before writing either, so a throw leaves the target untouched.
  void write_lr_and_betas(int64_t t) {
    auto [lrs, betas] = values_at(t);
    write_lr(lrs);
    if (cycle_betas_) write_betas(betas);
  }

  // zip() semantics: a shorter list writes only the first groups.
  void write_lr(const std::vector<double>& lrs) {
    size_t n = std::min(lrs.size(), target_->num_groups());
    for (size_t g = 0; g < n; ++g) target_->set_lr(g, lrs[g]);
  }

  void write_betas(const std::vector<Betas>& betas) {
    size_t n = std::min(betas.size(), target_->num_groups());
    for (size_t g = 0; g < n; ++g) target_->set_betas(g, betas[g]);
  }

  std::unique_ptr<Schedule> schedule_;
  std::shared_ptr<LRTarget> target_;
  int64_t t_;
  bool cycle_betas_ = false;  // OneCycle's cycle_momentum, kept only for optimizers with betas
};

}  // namespace
}  // namespace optim

std::shared_ptr<LRScheduler> make_lr_scheduler(const SchedulerConfig& config,
                                               std::shared_ptr<LRTarget> target,
                                               std::vector<std::string>* warnings) {
  if (!target) throw ConfigError("scheduler: no optimizer to schedule");
  std::vector<double> lrs;
  for (size_t g = 0; g < target->num_groups(); ++g) lrs.push_back(target->lr(g));
  auto parsed = optim::parse_schedule(config, lrs, warnings);
  return std::make_shared<optim::ScheduledLR>(std::move(parsed.schedule), std::move(target),
                                              parsed.last_batch_iteration, warnings);
}

std::vector<std::string> supported_lr_schedulers() { return optim::schedule_names(); }

}  // namespace deepspeed
