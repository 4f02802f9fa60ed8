// DeepSpeed's LR schedules: values at chosen steps against the formulas of lr_schedules.py worked
// by hand, the writes into real libtorch optimizers, state round trips and config errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "deepspeed/errors.h"
#include "deepspeed/lr_scheduler.h"
#include "optim/lr_schedules.h"

namespace lr_schedule_test {

using deepspeed::ConfigError;
using deepspeed::LRScheduler;
using deepspeed::LRTarget;
using deepspeed::SchedulerConfig;
using nlohmann::json;

namespace {

constexpr double kTol = 1e-12;
constexpr double kPi = 3.14159265358979323846;

// An optimizer stand-in: per-group lr, and betas or momentum when asked for.
class FakeTarget : public LRTarget {
 public:
  enum Kind { kPlain, kBetas, kMomentum };
  explicit FakeTarget(std::vector<double> lrs, Kind kind = kBetas)
      : lrs_(std::move(lrs)),
        betas_(lrs_.size(), {0.9, 0.999}),
        mom_(lrs_.size(), 0.0),
        kind_(kind) {}
  size_t num_groups() const override { return lrs_.size(); }
  double lr(size_t g) const override { return lrs_.at(g); }
  void set_lr(size_t g, double lr) override { lrs_.at(g) = lr; }
  bool has_betas() const override { return kind_ == kBetas; }
  std::pair<double, double> betas(size_t g) const override { return betas_.at(g); }
  void set_betas(size_t g, std::pair<double, double> b) override { betas_.at(g) = b; }
  bool has_momentum() const override { return kind_ == kMomentum; }
  double momentum(size_t g) const override { return mom_.at(g); }
  void set_momentum(size_t g, double m) override { mom_.at(g) = m; }

  std::vector<double> lrs_;
  std::vector<std::pair<double, double>> betas_;
  std::vector<double> mom_;
  Kind kind_;
};

std::shared_ptr<LRScheduler> make(const std::string& type, json params,
                                  std::shared_ptr<LRTarget> target,
                                  std::vector<std::string>* warnings = nullptr) {
  return deepspeed::make_lr_scheduler(SchedulerConfig{type, std::move(params)}, std::move(target),
                                      warnings);
}

// Steps `s` until its t equals `t` and returns the lr of group 0.
double lr_at(LRScheduler& s, int64_t t) {
  while (s.last_batch_iteration() < t) s.step();
  EXPECT_EQ(s.last_batch_iteration(), t);
  return s.get_lr().at(0);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no ConfigError>";
}

}  // namespace

// ---- values of each schedule ----

TEST(WarmupLR, LogWarmupMatchesDeepSpeedFormula) {
  auto target = std::make_shared<FakeTarget>(std::vector<double>{0.5});
  auto s = make("WarmupLR",
                {{"warmup_min_lr", 0.1}, {"warmup_max_lr", 1.1}, {"warmup_num_steps", 10}}, target);
  EXPECT_EQ(s->last_batch_iteration(), -1);
  EXPECT_NEAR(target->lr(0), 0.1, kTol);  // construction writes min_lr
  EXPECT_NEAR(lr_at(*s, 0), 0.1, kTol);   // ln(1) = 0: the second lr is min_lr too
  EXPECT_NEAR(lr_at(*s, 1), 0.1 + 1.0 * std::log(2.0) / std::log(10.0), kTol);
  EXPECT_NEAR(lr_at(*s, 4), 0.1 + 1.0 * std::log(5.0) / std::log(10.0), kTol);
  EXPECT_NEAR(lr_at(*s, 9), 1.1, kTol);  // ln(10)/ln(10)
  EXPECT_NEAR(lr_at(*s, 10), 1.1, kTol);
  EXPECT_NEAR(lr_at(*s, 11), 1.1, kTol);
  EXPECT_NEAR(lr_at(*s, 1000), 1.1, kTol);
}

TEST(WarmupLR, LinearWarmupAndStepsClampedToTwo) {
  auto target = std::make_shared<FakeTarget>(std::vector<double>{0.5});
  auto s =
      make("WarmupLR",
           {{"warmup_max_lr", 0.2}, {"warmup_num_steps", 10}, {"warmup_type", "linear"}}, target);
  EXPECT_NEAR(target->lr(0), 0.0, kTol);
  EXPECT_NEAR(lr_at(*s, 0), 0.0, kTol);
  EXPECT_NEAR(lr_at(*s, 1), 0.02, kTol);
  EXPECT_NEAR(lr_at(*s, 5), 0.1, kTol);
  EXPECT_NEAR(lr_at(*s, 9), 0.18, kTol);
  EXPECT_NEAR(lr_at(*s, 10), 0.2, kTol);

  auto t2 = std::make_shared<FakeTarget>(std::vector<double>{0.5});
  auto clamped = make("WarmupLR", {{"warmup_num_steps", 1}, {"warmup_type", "linear"}}, t2);
  EXPECT_NEAR(lr_at(*clamped, 1), 0.001 * 0.5, kTol);  // W = 2, not 1
  EXPECT_NEAR(lr_at(*clamped, 2), 0.001, kTol);
}

TEST(WarmupLR, DefaultsAreDeepSpeeds) {
  deepspeed::optim::WarmupLR s;
  EXPECT_EQ(s.warmup_num_steps, 1000);
  auto target = std::make_shared<FakeTarget>(std::vector<double>{0.5});
  auto sched = make("WarmupLR", json::object(), target);
  EXPECT_NEAR(lr_at(*sched, 99), 0.001 * std::log(100.0) / std::log(1000.0), kTol);
  EXPECT_NEAR(lr_at(*sched, 999), 0.001, kTol);
}

TEST(WarmupDecayLR, DecaysLinearlyToZeroAtTotal) {
  auto target = std::make_shared<FakeTarget>(std::vector<double>{0.5});
  auto s = make("WarmupDecayLR",
                {{"warmup_min_lr", 0.0},
                 {"warmup_max_lr", 1.0},
                 {"warmup_num_steps", 10},
                 {"total_num_steps", 20},
                 {"warmup_type", "linear"}},
                target);
  EXPECT_NEAR(target->lr(0), 0.0, kTol);
  EXPECT_NEAR(lr_at(*s, 0), 0.0, kTol);
  EXPECT_NEAR(lr_at(*s, 9), 0.9, kTol);
  EXPECT_NEAR(lr_at(*s, 10), 1.0, kTol);  // (20 - 10) / 10
  EXPECT_NEAR(lr_at(*s, 11), 0.9, kTol);
  EXPECT_NEAR(lr_at(*s, 15), 0.5, kTol);
  EXPECT_NEAR(lr_at(*s, 20), 0.0, kTol);
  EXPECT_NEAR(lr_at(*s, 25), 0.0, kTol);  // clamped at 0, never negative
}

TEST(WarmupDecayLR, TotalNotAboveWarmupWarnsAndUsesSpanOfOne) {
  std::vector<std::string> warnings;
  deepspeed::optim::WarmupDecayLR s;
  s.min_lr = {0.0};
  s.max_lr = {1.0};
  s.warmup_num_steps = 10;
  s.total_num_steps = 10;
  EXPECT_NEAR(s.lr_at(10)[0], 0.0, kTol);  // max(1, T - W) = 1
  auto target = std::make_shared<FakeTarget>(std::vector<double>{0.5});
  make("WarmupDecayLR", {{"warmup_num_steps", 10}, {"total_num_steps", 5}}, target, &warnings);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("scheduler.params.total_num_steps"), std::string::npos);
}

TEST(WarmupCosineLR, UsesOptimizerLrAndDeepSpeedQuirks) {
  auto target = std::make_shared<FakeTarget>(std::vector<double>{0.5, 0.2});
  auto s = make("WarmupCosineLR",
                {{"total_num_steps", 12},
                 {"warmup_num_steps", 4},
                 {"warmup_min_ratio", 0.1},
                 {"cos_min_ratio", 0.01},
                 {"warmup_type", "linear"}},
                target);
  // Construction writes [0.0]: only the first group.
  EXPECT_NEAR(target->lr(0), 0.0, kTol);
  EXPECT_NEAR(target->lr(1), 0.2, kTol);
  s->step();  // t = 0: ratio = r0
  EXPECT_NEAR(target->lr(0), 0.5 * 0.1, kTol);
  EXPECT_NEAR(target->lr(1), 0.2 * 0.1, kTol);
  EXPECT_NEAR(lr_at(*s, 2), 0.5 * (0.1 + 0.9 * 0.5), kTol);
  EXPECT_NEAR(lr_at(*s, 3), 0.5 * (0.1 + 0.9 * 0.75), kTol);
  auto cosine = [](double s, double S) { return 0.01 + 0.99 * (1 + std::cos(kPi * s / S)) / 2; };
  EXPECT_NEAR(lr_at(*s, 4), 0.5 * cosine(1, 8), kTol);  // s = t - W + 1
  EXPECT_NEAR(lr_at(*s, 5), 0.5 * cosine(2, 8), kTol);
  EXPECT_NEAR(lr_at(*s, 11), 0.5 * 0.01, kTol);  // s = S: the floor c
  EXPECT_NEAR(s->get_lr()[1], 0.2 * 0.01, kTol);
  EXPECT_NEAR(lr_at(*s, 12), 0.5 * cosine(9, 8), kTol);  // past T the cosine rises again
  EXPECT_NEAR(lr_at(*s, 17), 0.5 * cosine(14, 8), kTol);
}

TEST(WarmupCosineLR, LogWarmupAndDefaults) {
  deepspeed::optim::WarmupCosineLR s;
  s.org_lr = {1.0};
  s.total_num_steps = 100;
  s.warmup_num_steps = 10;
  EXPECT_NEAR(s.lr_at(0)[0], 0.0, kTol);
  EXPECT_NEAR(s.lr_at(4)[0], std::log(5.0) / std::log(10.0), kTol);
  EXPECT_NEAR(s.lr_at(99)[0], 0.0001, kTol);
  EXPECT_EQ(s.initial_lr(), std::vector<double>{0.0});
}

// total_num_steps == warmup_num_steps: DeepSpeed trains those steps (all warm-up) and divides by
// zero at the next; here too the T steps run, and the step past them is refused naming the key.
TEST(WarmupCosineLR, TotalEqualToWarmupRunsItsStepsThenRefusesTheNext) {
  auto target = std::make_shared<FakeTarget>(std::vector<double>{0.5});
  auto s = make("WarmupCosineLR",
                {{"total_num_steps", 4}, {"warmup_num_steps", 4}, {"warmup_type", "linear"}},
                target);
  for (int t = 0; t < 4; ++t) {
    s->step();
    EXPECT_NEAR(target->lr(0), 0.5 * t / 4.0, kTol) << "step " << t + 1;
  }
  const auto msg = error_of([&] { s->step(); });
  EXPECT_NE(msg.find("step 5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("scheduler.params.total_num_steps"), std::string::npos) << msg;
}

TEST(OneCycle, CyclesLrAndBetasThenDecays) {
  auto target = std::make_shared<FakeTarget>(std::vector<double>{0.5});
  auto s = make("OneCycle",
                {{"cycle_min_lr", 0.1},
                 {"cycle_max_lr", 1.0},
                 {"cycle_first_step_size", 4},
                 {"cycle_second_step_size", 6},
                 {"decay_step_size", 2},
                 {"decay_lr_rate", 0.5},
                 {"decay_mom_rate", 0.1}},
                target);
  EXPECT_NEAR(target->lr(0), 0.1, kTol);  // construction: min lr, (min_mom, 0.99)
  EXPECT_NEAR(target->betas(0).first, 0.8, kTol);
  EXPECT_NEAR(target->betas(0).second, 0.99, kTol);
  // total 10, ratio 0.4. t = 0: x = 0.1, scale 0.25.
  EXPECT_NEAR(lr_at(*s, 0), 0.1 + 0.9 * 0.25, kTol);
  EXPECT_NEAR(target->betas(0).first, 0.9 - 0.1 * 0.25, kTol);
  EXPECT_NEAR(target->betas(0).second, 0.99, kTol);  // beta2 forced to 0.99
  EXPECT_NEAR(lr_at(*s, 3), 1.0, kTol);              // x = ratio: the peak
  EXPECT_NEAR(s->get_mom().at(0), 0.8, kTol);
  EXPECT_NEAR(lr_at(*s, 6), 0.1 + 0.9 * 0.5, kTol);  // x = 0.7: (0.7 - 1) / (0.4 - 1)
  EXPECT_NEAR(s->get_mom().at(0), 0.85, kTol);
  EXPECT_NEAR(lr_at(*s, 9), 0.1, kTol);  // i = 10: a new cycle, x = 0
  EXPECT_NEAR(s->get_mom().at(0), 0.9, kTol);
  // Decay phase, d = t - total + 1.
  EXPECT_NEAR(lr_at(*s, 10), 0.1 / (1 + 0.5 * 0.5), kTol);
  EXPECT_NEAR(s->get_mom().at(0), 0.9 * (1 + 0.1 * 0.5), kTol);
  EXPECT_NEAR(lr_at(*s, 13), 0.1 / (1 + 0.5 * 2.0), kTol);
  EXPECT_NEAR(s->get_mom().at(0), 0.9 * (1 + 0.1 * 2.0), kTol);
}

TEST(OneCycle, NoDecayHoldsMinLrAndMaxMomentum) {
  deepspeed::optim::OneCycle s;
  s.min_lr = 0.01;
  s.max_lr = 0.1;
  s.first_step_size = 5;
  s.second_step_size = 5;
  s.decay_lr_rate = 0.5;  // ignored: decay_step_size is 0
  EXPECT_NEAR(s.lr_value(4), 0.1, kTol);
  EXPECT_NEAR(s.lr_value(10), 0.01, kTol);
  EXPECT_NEAR(s.lr_value(500), 0.01, kTol);
  EXPECT_NEAR(s.beta1_value(500), 0.9, kTol);
}

TEST(OneCycle, SecondStepSizeDefaultsToFirst) {
  auto target = std::make_shared<FakeTarget>(std::vector<double>{0.5});
  auto s =
      make("OneCycle", {{"cycle_min_lr", 0.0}, {"cycle_max_lr", 1.0}, {"cycle_first_step_size", 4}},
           target);
  EXPECT_NEAR(lr_at(*s, 3), 1.0, kTol);  // i = 4 of total 8
  EXPECT_NEAR(lr_at(*s, 5), 0.5, kTol);  // x = 0.75: (0.75 - 1) / (0.5 - 1)
  EXPECT_NEAR(lr_at(*s, 7), 0.0, kTol);
}

TEST(OneCycle, CycleMomentumOffLeavesBetas) {
  auto target = std::make_shared<FakeTarget>(std::vector<double>{0.5});
  auto s = make("OneCycle",
                {{"cycle_min_lr", 0.0}, {"cycle_max_lr", 1.0}, {"cycle_momentum", false}}, target);
  s->step();
  EXPECT_EQ(target->betas(0), std::make_pair(0.9, 0.999));
  EXPECT_TRUE(s->get_mom().empty());
}

TEST(LRRangeTest, ContinuousAndStaircase) {
  auto target = std::make_shared<FakeTarget>(std::vector<double>{0.5});
  auto s = make("LRRangeTest",
                {{"lr_range_test_min_lr", 0.01},
                 {"lr_range_test_step_size", 4},
                 {"lr_range_test_step_rate", 2.0}},
                target);
  EXPECT_NEAR(target->lr(0), 0.01, kTol);
  EXPECT_NEAR(lr_at(*s, 0), 0.01 * (1 + 2.0 * 0.25), kTol);
  EXPECT_NEAR(lr_at(*s, 3), 0.03, kTol);
  EXPECT_NEAR(lr_at(*s, 9), 0.01 * (1 + 2.0 * 2.5), kTol);

  auto t2 = std::make_shared<FakeTarget>(std::vector<double>{0.5});
  auto stairs = make("LRRangeTest",
                     {{"lr_range_test_min_lr", 0.01},
                      {"lr_range_test_step_size", 4},
                      {"lr_range_test_step_rate", 2.0},
                      {"lr_range_test_staircase", true}},
                     t2);
  EXPECT_NEAR(lr_at(*stairs, 0), 0.01, kTol);
  EXPECT_NEAR(lr_at(*stairs, 2), 0.01, kTol);
  EXPECT_NEAR(lr_at(*stairs, 3), 0.03, kTol);
  EXPECT_NEAR(lr_at(*stairs, 9), 0.05, kTol);
}

// ---- per-group lists ----

TEST(LRSchedule, PerGroupListsForWarmupAndRangeTest) {
  auto target = std::make_shared<FakeTarget>(std::vector<double>{0.5, 0.5});
  auto s = make("WarmupDecayLR",
                {{"warmup_min_lr", json::array({0.0, 0.1})},
                 {"warmup_max_lr", json::array({1.0, 0.5})},
                 {"warmup_num_steps", 4},
                 {"total_num_steps", 8},
                 {"warmup_type", "linear"}},
                target);
  EXPECT_NEAR(target->lr(0), 0.0, kTol);
  EXPECT_NEAR(target->lr(1), 0.1, kTol);
  lr_at(*s, 2);
  EXPECT_NEAR(target->lr(0), 0.5, kTol);
  EXPECT_NEAR(target->lr(1), 0.1 + 0.4 * 0.5, kTol);

  auto t2 = std::make_shared<FakeTarget>(std::vector<double>{0.5, 0.5});
  auto r = make("LRRangeTest", {{"lr_range_test_min_lr", json::array({0.1, 0.2})}}, t2);
  EXPECT_EQ(r->get_lr(), (std::vector<double>{0.1, 0.2}));
}

TEST(LRSchedule, PerGroupListOfWrongLengthIsAnError) {
  auto target = std::make_shared<FakeTarget>(std::vector<double>{0.5, 0.5});
  auto msg = error_of([&] {
    make("WarmupLR", {{"warmup_max_lr", json::array({1.0, 0.5, 0.2})}}, target);
  });
  EXPECT_NE(msg.find("scheduler.params.warmup_max_lr"), std::string::npos) << msg;
  EXPECT_NE(msg.find("2 value(s)"), std::string::npos) << msg;
  msg = error_of([&] {
    make("OneCycle", {{"cycle_min_lr", json::array({0.1, 0.1})}, {"cycle_max_lr", 1.0}}, target);
  });
  EXPECT_NE(msg.find("scheduler.params.cycle_min_lr"), std::string::npos) << msg;
}

// ---- real libtorch optimizers ----

TEST(LRSchedule, DrivesTorchAdamWLrPerGroup) {
  auto a = torch::zeros({3}, torch::requires_grad());
  auto b = torch::zeros({2}, torch::requires_grad());
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{a});
  groups.emplace_back(std::vector<torch::Tensor>{b});
  auto opt = std::make_shared<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(0.5));
  auto s =
      make("WarmupLR", {{"warmup_max_lr", 0.4}, {"warmup_num_steps", 4}, {"warmup_type", "linear"}},
           deepspeed::lr_target_for(opt));
  auto lr_of = [&](size_t g) { return opt->param_groups()[g].options().get_lr(); };
  EXPECT_NEAR(lr_of(0), 0.0, kTol);
  EXPECT_NEAR(lr_of(1), 0.0, kTol);
  s->step();
  s->step();
  EXPECT_NEAR(lr_of(0), 0.1, kTol);
  EXPECT_NEAR(lr_of(1), 0.1, kTol);
  EXPECT_EQ(s->get_lr(), (std::vector<double>{lr_of(0), lr_of(1)}));
}

TEST(LRSchedule, OneCycleWritesTorchAdamBetas) {
  auto p = torch::zeros({3}, torch::requires_grad());
  torch::optim::Adam opt({p}, torch::optim::AdamOptions(1e-3));
  auto s = make("OneCycle",
                {{"cycle_min_lr", 0.1},
                 {"cycle_max_lr", 1.0},
                 {"cycle_first_step_size", 4},
                 {"cycle_second_step_size", 6}},
                deepspeed::lr_target_for(opt));
  auto& o = static_cast<torch::optim::AdamOptions&>(opt.param_groups()[0].options());
  EXPECT_NEAR(std::get<0>(o.betas()), 0.8, kTol);
  EXPECT_NEAR(std::get<1>(o.betas()), 0.99, kTol);
  s->step();
  EXPECT_NEAR(o.lr(), 0.325, kTol);
  EXPECT_NEAR(std::get<0>(o.betas()), 0.875, kTol);
  EXPECT_NEAR(std::get<1>(o.betas()), 0.99, kTol);
}

// DeepSpeed 0.16.5 cycles momentum only through `betas`: given SGD it warns and leaves SGD's
// momentum alone, so the same config trains the same way in both.
TEST(LRSchedule, OneCycleLeavesSgdMomentumAloneLikeDeepSpeed) {
  auto p = torch::zeros({3}, torch::requires_grad());
  torch::optim::SGD opt({p}, torch::optim::SGDOptions(0.1).momentum(0.9));
  std::vector<std::string> warnings;
  auto s = make("OneCycle",
                {{"cycle_min_lr", 0.1},
                 {"cycle_max_lr", 1.0},
                 {"cycle_first_step_size", 4},
                 {"cycle_second_step_size", 6}},
                deepspeed::lr_target_for(opt), &warnings);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("cycle_momentum is disabled because the optimizer does not support "
                             "momentum, no betas attribute in defaults"),
            std::string::npos)
      << warnings[0];
  auto& o = static_cast<torch::optim::SGDOptions&>(opt.param_groups()[0].options());
  EXPECT_EQ(o.momentum(), 0.9);  // construction writes lr only
  EXPECT_NEAR(o.lr(), 0.1, kTol);
  for (int64_t t = 0; t < 14; ++t) {  // the whole cycle (10 steps) and into the decay phase
    s->step();
    EXPECT_EQ(o.momentum(), 0.9) << "t=" << t;
    if (t == 3) EXPECT_NEAR(o.lr(), 1.0, kTol);  // the lr still cycles: peak at t = first - 1
  }
  EXPECT_TRUE(s->get_mom().empty());
}

TEST(LRSchedule, OneCycleStillCyclesAdamBetasOverTheCycle) {
  auto p = torch::zeros({3}, torch::requires_grad());
  torch::optim::Adam opt({p}, torch::optim::AdamOptions(0.1));
  std::vector<std::string> warnings;
  auto s = make("OneCycle",
                {{"cycle_min_lr", 0.1},
                 {"cycle_max_lr", 1.0},
                 {"cycle_first_step_size", 4},
                 {"cycle_second_step_size", 6}},
                deepspeed::lr_target_for(opt), &warnings);
  EXPECT_TRUE(warnings.empty());
  auto& o = static_cast<torch::optim::AdamOptions&>(opt.param_groups()[0].options());
  // beta1 = max_mom - (max_mom - min_mom) * scale: 0.8 at the lr peak (t = 3), 0.9 at t = 9.
  while (s->last_batch_iteration() < 3) s->step();
  EXPECT_NEAR(std::get<0>(o.betas()), 0.8, kTol);
  EXPECT_NEAR(s->get_mom().at(0), 0.8, kTol);
  while (s->last_batch_iteration() < 9) s->step();
  EXPECT_NEAR(std::get<0>(o.betas()), 0.9, kTol);
  EXPECT_NEAR(std::get<1>(o.betas()), 0.99, kTol);
}

TEST(LRSchedule, OneCycleWithoutMomentumWarnsAndSetsLrOnly) {
  auto p = torch::zeros({3}, torch::requires_grad());
  auto opt = std::make_shared<torch::optim::Adagrad>(std::vector<torch::Tensor>{p},
                                                     torch::optim::AdagradOptions(0.1));
  std::vector<std::string> warnings;
  auto s = make("OneCycle", {{"cycle_min_lr", 0.1}, {"cycle_max_lr", 1.0}},
                deepspeed::lr_target_for(opt), &warnings);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("cycle_momentum"), std::string::npos);
  s->step();
  EXPECT_GT(opt->param_groups()[0].options().get_lr(), 0.1);
  EXPECT_TRUE(s->get_mom().empty());
}

// ---- state ----

TEST(LRSchedule, StateDictRoundTrip) {
  json params = {{"cycle_min_lr", 0.1}, {"cycle_max_lr", 1.0}, {"cycle_first_step_size", 4}};
  auto t1 = std::make_shared<FakeTarget>(std::vector<double>{0.5});
  auto s1 = make("OneCycle", params, t1);
  for (int i = 0; i < 6; ++i) s1->step();
  json state = s1->state_dict();
  EXPECT_EQ(state, json({{"last_batch_iteration", 5}}));

  auto t2 = std::make_shared<FakeTarget>(std::vector<double>{0.5});
  auto s2 = make("OneCycle", params, t2);
  s2->load_state_dict(state);
  EXPECT_EQ(s2->last_batch_iteration(), 5);
  EXPECT_DOUBLE_EQ(t2->lr(0), t1->lr(0));  // written at load, not only at the next step
  EXPECT_DOUBLE_EQ(t2->betas(0).first, t1->betas(0).first);
  s1->step();
  s2->step();
  EXPECT_DOUBLE_EQ(t2->lr(0), t1->lr(0));

  EXPECT_THROW(s2->load_state_dict(json::object()), deepspeed::CheckpointError);
  EXPECT_THROW(s2->load_state_dict({{"last_batch_iteration", "x"}}), deepspeed::CheckpointError);
}

TEST(LRSchedule, LastBatchIterationParamResumesWithoutInitialWrite) {
  auto target = std::make_shared<FakeTarget>(std::vector<double>{0.5});
  auto s = make("WarmupLR",
                {{"warmup_max_lr", 1.0},
                 {"warmup_num_steps", 10},
                 {"warmup_type", "linear"},
                 {"last_batch_iteration", 4}},
                target);
  EXPECT_EQ(s->last_batch_iteration(), 4);
  EXPECT_NEAR(target->lr(0), 0.5, kTol);
  s->step();
  EXPECT_NEAR(target->lr(0), 0.5, kTol);  // t = 5: 5 / 10
  EXPECT_EQ(s->name(), "WarmupLR");
}

// ---- config errors and warnings ----

TEST(LRScheduleConfig, UnknownTypeListsSupportedNames) {
  auto target = std::make_shared<FakeTarget>(std::vector<double>{0.5});
  auto msg = error_of([&] { make("CosineAnnealing", json::object(), target); });
  EXPECT_NE(msg.find("scheduler.type"), std::string::npos) << msg;
  EXPECT_NE(msg.find("CosineAnnealing"), std::string::npos) << msg;
  for (const auto& name : deepspeed::supported_lr_schedulers()) {
    EXPECT_NE(msg.find(name), std::string::npos) << name;
  }
  EXPECT_EQ(deepspeed::supported_lr_schedulers().size(), 5u);
  EXPECT_NO_THROW(make("warmuplr", json::object(), target));  // case-insensitive
}

TEST(LRScheduleConfig, MissingRequiredParamsNameTheKey) {
  auto target = std::make_shared<FakeTarget>(std::vector<double>{0.5});
  auto msg = error_of([&] { make("WarmupDecayLR", json::object(), target); });
  EXPECT_NE(msg.find("scheduler.params.total_num_steps"), std::string::npos) << msg;
  msg = error_of([&] { make("WarmupCosineLR", json::object(), target); });
  EXPECT_NE(msg.find("scheduler.params.total_num_steps"), std::string::npos) << msg;
  msg = error_of([&] { make("OneCycle", {{"cycle_max_lr", 1.0}}, target); });
  EXPECT_NE(msg.find("scheduler.params.cycle_min_lr"), std::string::npos) << msg;
  msg = error_of([&] { make("OneCycle", {{"cycle_min_lr", 1.0}}, target); });
  EXPECT_NE(msg.find("scheduler.params.cycle_max_lr"), std::string::npos) << msg;
}

TEST(LRScheduleConfig, WrongTypesNameTheKey) {
  auto target = std::make_shared<FakeTarget>(std::vector<double>{0.5});
  auto msg = error_of([&] { make("WarmupLR", {{"warmup_num_steps", "many"}}, target); });
  EXPECT_NE(msg.find("scheduler.params.warmup_num_steps"), std::string::npos) << msg;
  msg = error_of([&] { make("WarmupLR", {{"warmup_num_steps", 10.5}}, target); });
  EXPECT_NE(msg.find("scheduler.params.warmup_num_steps"), std::string::npos) << msg;
  msg = error_of([&] { make("WarmupLR", {{"warmup_max_lr", "auto"}}, target); });
  EXPECT_NE(msg.find("scheduler.params.warmup_max_lr"), std::string::npos) << msg;
  EXPECT_NE(msg.find("auto"), std::string::npos) << msg;
  msg = error_of([&] { make("LRRangeTest", {{"lr_range_test_staircase", 3}}, target); });
  EXPECT_NE(msg.find("scheduler.params.lr_range_test_staircase"), std::string::npos) << msg;
  msg = error_of([&] { make("WarmupLR", json::array({1, 2}), target); });
  EXPECT_NE(msg.find("scheduler.params"), std::string::npos) << msg;
  msg = error_of([&] {
    make("OneCycle", {{"cycle_min_lr", 0.1}, {"cycle_max_lr", 1}, {"cycle_first_step_size", 0}},
         target);
  });
  EXPECT_NE(msg.find("scheduler.params.cycle_first_step_size"), std::string::npos) << msg;
}

TEST(LRScheduleConfig, NumbersAsStringsAreAccepted) {
  auto target = std::make_shared<FakeTarget>(std::vector<double>{0.5});
  auto s = make("WarmupLR",
                {{"warmup_max_lr", "1e-1"}, {"warmup_num_steps", "1e1"}, {"warmup_type", "linear"}},
                target);
  EXPECT_NEAR(lr_at(*s, 5), 0.05, kTol);
}

// DeepSpeed builds Cls(optimizer, **params) and no schedule class takes **kwargs: an unknown key is
// a TypeError there, so a typo must not train with the default warm-up here.
TEST(LRScheduleConfig, UnknownKeysAreRefusedWithASuggestion) {
  auto target = std::make_shared<FakeTarget>(std::vector<double>{0.5});
  std::vector<std::string> warnings;
  auto msg = error_of([&] {
    make("WarmupLR", {{"warmup_num_step", 10}, {"warmup_max_lr", 1.0}}, target, &warnings);
  });
  EXPECT_NE(msg.find("scheduler.params.warmup_num_step is not a parameter of WarmupLR"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("did you mean 'scheduler.params.warmup_num_steps'"), std::string::npos)
      << msg;
  // WarmupCosineLR scales the optimizer's lr; DeepSpeed refuses WarmupLR's warmup_max_lr there.
  msg = error_of([&] {
    make("WarmupCosineLR", {{"total_num_steps", 2000}, {"warmup_max_lr", 1.0}}, target);
  });
  EXPECT_NE(msg.find("scheduler.params.warmup_max_lr is not a parameter of WarmupCosineLR"),
            std::string::npos)
      << msg;
  const std::vector<std::pair<std::string, json>> valid = {
      {"WarmupDecayLR", {{"total_num_steps", 2000}}},
      {"OneCycle", {{"cycle_min_lr", 0.1}, {"cycle_max_lr", 1.0}}},
      {"LRRangeTest", json::object()}};
  for (auto [type, params] : valid) {
    params["bogus"] = 1;
    msg = error_of([&] { make(type, params, target); });
    EXPECT_NE(msg.find("scheduler.params.bogus is not a parameter of " + type), std::string::npos)
        << msg;
  }
  // last_batch_iteration is a keyword of every DeepSpeed schedule.
  EXPECT_NO_THROW(make("LRRangeTest", {{"last_batch_iteration", -1}}, target));
}

TEST(LRScheduleConfig, BadWarmupTypeWarnsAndFallsBackToLog) {
  auto target = std::make_shared<FakeTarget>(std::vector<double>{0.5});
  std::vector<std::string> warnings;
  auto s = make("WarmupLR",
                {{"warmup_type", "cosine"}, {"warmup_num_steps", 10}, {"warmup_max_lr", 1.0}},
                target, &warnings);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("scheduler.params.warmup_type"), std::string::npos) << warnings[0];
  EXPECT_NEAR(lr_at(*s, 4), std::log(5.0) / std::log(10.0), kTol);  // fell back to log
}

}  // namespace lr_schedule_test
