#include "optim/lr_schedules.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "config/json_reader.h"
#include "deepspeed/errors.h"
#include "optim/param_reader.h"
#include "util/ascii.h"

namespace deepspeed::optim {
namespace {
constexpr double kPi = 3.14159265358979323846;
}  // namespace

// ---- math: operation order follows lr_schedules.py so results match DeepSpeed bit for bit ----

double warmup_fraction(int64_t t, int64_t warmup_num_steps, WarmupType type) {
  if (type == WarmupType::Linear) {
    return static_cast<double>(t) / static_cast<double>(warmup_num_steps);
  }
  double inverse_log_warm_up = 1.0 / std::log(static_cast<double>(warmup_num_steps));
  return inverse_log_warm_up * std::log(static_cast<double>(t + 1));
}

double WarmupLR::gamma(int64_t t) const {
  if (t < warmup_num_steps) return warmup_fraction(t, warmup_num_steps, warmup_type);
  return 1.0;
}

std::vector<double> WarmupLR::lr_at(int64_t t) const {
  double g = gamma(t);
  std::vector<double> out;
  for (size_t i = 0; i < min_lr.size(); ++i) out.push_back(min_lr[i] + (max_lr[i] - min_lr[i]) * g);
  return out;
}

double WarmupDecayLR::gamma(int64_t t) const {
  if (t < warmup_num_steps) return warmup_fraction(t, warmup_num_steps, warmup_type);
  double span = std::max<double>(1.0, static_cast<double>(total_num_steps - warmup_num_steps));
  return std::max(0.0, static_cast<double>(total_num_steps - t) / span);
}

double WarmupCosineLR::ratio(int64_t t) const {
  if (t < warmup_num_steps) {
    double g = warmup_fraction(t, warmup_num_steps, warmup_type);
    return warmup_min_ratio + g * (1.0 - warmup_min_ratio);
  }
  if (total_num_steps == warmup_num_steps) {
    throw ConfigError("WarmupCosineLR: step " + std::to_string(t + 1) + " is past " + total_key +
                      " = warmup_num_steps = " + std::to_string(total_num_steps) +
                      ", where the cosine phase has no length (DeepSpeed divides by zero here); "
                      "raise total_num_steps to train longer");
  }
  double real_last_step = static_cast<double>(t - warmup_num_steps + 1);
  double real_total_steps = static_cast<double>(total_num_steps - warmup_num_steps);
  double cos_part = (1 + std::cos(kPi * real_last_step / real_total_steps)) / 2;
  return std::max(0.0, cos_min_ratio + (1.0 - cos_min_ratio) * cos_part);
}

std::vector<double> WarmupCosineLR::lr_at(int64_t t) const {
  double r = ratio(t);
  std::vector<double> out;
  for (double lr : org_lr) out.push_back(lr * r);
  return out;
}

double OneCycle::scale(int64_t t) const {
  double total = first_step_size + second_step_size;
  double step_ratio = first_step_size / total;
  double i = static_cast<double>(t + 1);
  double cycle = std::floor(1 + i / total);
  double x = 1.0 + i / total - cycle;
  return x <= step_ratio ? x / step_ratio : (x - 1) / (step_ratio - 1);
}

double OneCycle::lr_value(int64_t t) const {
  double total = first_step_size + second_step_size;
  if (static_cast<double>(t) < total) return min_lr + (max_lr - min_lr) * scale(t);
  if (decay_step_size == 0 || decay_lr_rate == 0) return min_lr;
  double d = static_cast<double>(t) - total + 1;
  return min_lr / (1 + decay_lr_rate * (d / decay_step_size));
}

double OneCycle::beta1_value(int64_t t) const {
  double total = first_step_size + second_step_size;
  if (static_cast<double>(t) < total) return max_mom - (max_mom - min_mom) * scale(t);
  if (decay_step_size == 0 || decay_mom_rate == 0) return max_mom;
  double d = static_cast<double>(t) - total + 1;
  return max_mom * (1 + decay_mom_rate * (d / decay_step_size));
}

std::vector<double> OneCycle::initial_lr() const { return std::vector<double>(num_groups, min_lr); }

std::vector<double> OneCycle::lr_at(int64_t t) const {
  return std::vector<double>(num_groups, lr_value(t));
}

std::vector<Betas> OneCycle::initial_betas() const {
  return std::vector<Betas>(num_groups, Betas{min_mom, 0.99});
}

std::vector<Betas> OneCycle::betas_at(int64_t t) const {
  return std::vector<Betas>(num_groups, Betas{beta1_value(t), 0.99});
}

std::vector<double> LRRangeTest::lr_at(int64_t t) const {
  double interval = static_cast<double>(t + 1) / step_size;
  if (staircase) interval = std::floor(interval);
  double increase = 1 + step_rate * interval;
  std::vector<double> out;
  for (double lr : min_lr) out.push_back(lr * increase);
  return out;
}

// ---- parsing ----

namespace {

WarmupType read_warmup_type(ParamReader& r, std::vector<std::string>* warnings) {
  std::string type = r.get_string("warmup_type", "log");
  if (type == "linear") return WarmupType::Linear;
  if (type != "log") {
    warn(warnings, r.path("warmup_type") + " = \"" + type +
                       "\" is not \"log\" or \"linear\"; using \"log\" as DeepSpeed does");
  }
  return WarmupType::Log;
}

int64_t read_warmup_steps(ParamReader& r) {
  return std::max<int64_t>(2, r.get_int("warmup_num_steps", 1000));
}

void warn_short_total(ParamReader& r, int64_t total, int64_t warmup,
                      std::vector<std::string>* warnings) {
  if (total < warmup) {
    warn(warnings, r.path("total_num_steps") + " (" + std::to_string(total) +
                       ") is less than warmup_num_steps (" + std::to_string(warmup) + ")");
  }
}

void fill_warmup(WarmupLR& s, ParamReader& r, size_t groups, std::vector<std::string>* warnings) {
  s.min_lr = r.get_per_group("warmup_min_lr", 0.0, groups);
  s.max_lr = r.get_per_group("warmup_max_lr", 0.001, groups);
  s.warmup_num_steps = read_warmup_steps(r);
  s.warmup_type = read_warmup_type(r, warnings);
}

std::unique_ptr<Schedule> parse_warmup(ParamReader& r, const std::vector<double>& lrs,
                                       std::vector<std::string>* w) {
  auto s = std::make_unique<WarmupLR>();
  fill_warmup(*s, r, lrs.size(), w);
  return s;
}

std::unique_ptr<Schedule> parse_warmup_decay(ParamReader& r, const std::vector<double>& lrs,
                                             std::vector<std::string>* w) {
  auto s = std::make_unique<WarmupDecayLR>();
  fill_warmup(*s, r, lrs.size(), w);
  s->total_num_steps = r.req_int("total_num_steps", "for WarmupDecayLR");
  warn_short_total(r, s->total_num_steps, s->warmup_num_steps, w);
  return s;
}

std::unique_ptr<Schedule> parse_warmup_cosine(ParamReader& r, const std::vector<double>& lrs,
                                              std::vector<std::string>* w) {
  auto s = std::make_unique<WarmupCosineLR>();
  s->org_lr = lrs;
  s->total_num_steps = r.req_int("total_num_steps", "for WarmupCosineLR");
  s->warmup_min_ratio = r.get_double("warmup_min_ratio", 0.0);
  s->warmup_num_steps = read_warmup_steps(r);
  s->cos_min_ratio = r.get_double("cos_min_ratio", 0.0001);
  s->warmup_type = read_warmup_type(r, w);
  // T == W is accepted, as DeepSpeed does: steps 1..T are all warm-up. Past them DeepSpeed divides
  // by T - W = 0; ratio() refuses that step instead, naming the keys.
  s->total_key = r.path("total_num_steps");
  warn_short_total(r, s->total_num_steps, s->warmup_num_steps, w);
  return s;
}

void require(bool ok, ParamReader& r, const std::string& key, const std::string& what) {
  if (!ok) throw ConfigError(r.path(key) + " must be " + what);
}

std::unique_ptr<Schedule> parse_one_cycle(ParamReader& r, const std::vector<double>& lrs,
                                          std::vector<std::string>* w) {
  auto s = std::make_unique<OneCycle>();
  s->num_groups = lrs.size();
  s->min_lr = r.req_double("cycle_min_lr", "for OneCycle");
  s->max_lr = r.req_double("cycle_max_lr", "for OneCycle");
  s->decay_lr_rate = r.get_double("decay_lr_rate", 0.0);
  s->first_step_size = r.get_double("cycle_first_step_size", 2000);
  s->second_step_size = r.get_double("cycle_second_step_size", s->first_step_size);
  r.accept("cycle_first_stair_count");  // accepted by DeepSpeed, unused by its formula
  r.accept("cycle_second_stair_count");
  s->decay_step_size = r.get_double("decay_step_size", 0);
  s->cycle_momentum = r.get_bool("cycle_momentum", true);
  s->min_mom = r.get_double("cycle_min_mom", 0.8);
  s->max_mom = r.get_double("cycle_max_mom", 0.9);
  s->decay_mom_rate = r.get_double("decay_mom_rate", 0.0);
  require(s->first_step_size > 0, r, "cycle_first_step_size", "> 0");
  require(s->second_step_size >= 0, r, "cycle_second_step_size", ">= 0");
  require(s->decay_step_size >= 0, r, "decay_step_size", ">= 0");
  return s;
}

std::unique_ptr<Schedule> parse_range_test(ParamReader& r, const std::vector<double>& lrs,
                                           std::vector<std::string>* w) {
  auto s = std::make_unique<LRRangeTest>();
  s->min_lr = r.get_per_group("lr_range_test_min_lr", 1e-3, lrs.size());
  s->step_size = r.get_double("lr_range_test_step_size", 2000);
  s->step_rate = r.get_double("lr_range_test_step_rate", 1.0);
  s->staircase = r.get_bool("lr_range_test_staircase", false);
  require(s->step_size > 0, r, "lr_range_test_step_size", "> 0");
  return s;
}

// DeepSpeed builds the schedule as Cls(optimizer, **params), and none of its schedule classes
// takes **kwargs: a key they do not name is a TypeError there. Refused here too, so that a typo
// such as "warmup_num_step" cannot train with the default 1000-step warm-up.
void reject_unknown(const ParamReader& r, const std::string& type) {
  auto unread = r.unread_keys();
  if (unread.empty()) return;
  auto known = r.known_keys();
  std::string suggestion = config::closest_key(unread.front(), known);
  std::string list;
  for (const auto& k : unread) list += (list.empty() ? "" : ", ") + k;
  std::string known_list;
  for (const auto& k : known) known_list += (known_list.empty() ? "" : ", ") + k;
  throw ConfigError(r.path(unread.front()) + " is not a parameter of " + type +
                    (suggestion.empty() ? "" : " (did you mean '" + r.path(suggestion) + "'?)") +
                    "; DeepSpeed's " + type +
                    " takes no other keyword (TypeError there). Unknown: " + list +
                    "; known: " + known_list);
}

using Parser = std::function<std::unique_ptr<Schedule>(ParamReader&, const std::vector<double>&,
                                                       std::vector<std::string>*)>;

const std::vector<std::pair<std::string, Parser>>& parsers() {
  static const std::vector<std::pair<std::string, Parser>> table = {
      {"WarmupLR", parse_warmup},
      {"WarmupDecayLR", parse_warmup_decay},
      {"WarmupCosineLR", parse_warmup_cosine},
      {"OneCycle", parse_one_cycle},
      {"LRRangeTest", parse_range_test}};
  return table;
}

const Parser& find_parser(const std::string& type) {
  for (const auto& [name, parser] : parsers()) {
    if (ascii_lower(name) == ascii_lower(type)) return parser;
  }
  std::string names;
  for (const auto& n : schedule_names()) names += (names.empty() ? "" : ", ") + n;
  throw ConfigError("scheduler.type: unknown scheduler \"" + type + "\"; supported: " + names);
}

}  // namespace

std::vector<std::string> schedule_names() {
  std::vector<std::string> out;
  for (const auto& entry : parsers()) out.push_back(entry.first);
  return out;
}

ParsedSchedule parse_schedule(const SchedulerConfig& config, const std::vector<double>& group_lrs,
                              std::vector<std::string>* warnings) {
  const Parser& parser = find_parser(config.type);
  if (group_lrs.empty()) {
    throw ConfigError("scheduler: the optimizer has no parameter groups to schedule");
  }
  ParamReader r(config.params, "scheduler.params");
  ParsedSchedule out;
  out.schedule = parser(r, group_lrs, warnings);
  out.last_batch_iteration = r.get_int("last_batch_iteration", -1);
  require(out.last_batch_iteration >= -1, r, "last_batch_iteration", ">= -1");
  reject_unknown(r, out.schedule->name());
  return out;
}

}  // namespace deepspeed::optim
