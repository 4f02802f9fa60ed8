// Loss scalers: scripted overflow patterns walked step by step against sequences worked by hand
// from DeepSpeed's update rules (loss_scaler.py for ZeRO, FP16_Optimizer._update_scale without),
// the factory's choice of defaults, state round trips and the inf/NaN check.
#include "precision/loss_scaler.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <vector>

#include "deepspeed/config.h"
#include "deepspeed/errors.h"
#include "support/expect.h"

namespace loss_scaler_test {

using deepspeed::CheckpointError;
using deepspeed::ConfigError;
using deepspeed::Fp16Config;
using deepspeed::precision::DynamicLossScaler;
using deepspeed::precision::has_inf_or_nan;
using deepspeed::precision::loss_scaler_from_state_dict;
using deepspeed::precision::LossScaler;
using deepspeed::precision::Fp16Wrapper;
using deepspeed::precision::make_loss_scaler;
using deepspeed::precision::ScaleRule;
using deepspeed::precision::StaticLossScaler;

namespace {

// Applies the pattern (true = overflow) and returns the scale after each update.
std::vector<double> walk(LossScaler& s, const std::vector<bool>& overflows) {
  std::vector<double> out;
  for (bool o : overflows) {
    s.update(o);
    out.push_back(s.scale());
  }
  return out;
}

std::vector<bool> clean(int n) { return std::vector<bool>(n, false); }

const DynamicLossScaler& as_dynamic(const LossScaler& s) {
  auto* d = dynamic_cast<const DynamicLossScaler*>(&s);
  EXPECT_NE(d, nullptr) << "expected a dynamic scaler";
  return *d;
}

// ---- ZeRO rule ----------------------------------------------------------------------------------

TEST(ZeroRule, CleanStepsDoubleEveryWindowCountedFromStart) {
  // last_overflow_iter starts at -1: doubling when (cur_iter + 1) % 4 == 0, i.e. iters 3 and 7.
  DynamicLossScaler s(8, /*window=*/4, /*min=*/1, /*hysteresis=*/1, false);
  EXPECT_EQ(s.scale(), 8);
  EXPECT_EQ(walk(s, clean(8)), (std::vector<double>{8, 8, 8, 16, 16, 16, 16, 32}));
  EXPECT_EQ(s.cur_iter(), 8);
  EXPECT_EQ(s.last_overflow_iter(), -1);
  EXPECT_TRUE(s.last_message().empty());
}

TEST(ZeroRule, WindowRestartsAtTheLastOverflow) {
  DynamicLossScaler s(16, 3, 1, 1, false);
  // iter 0 overflow -> 8; then (iter - 0) % 3 == 0 first at iter 3; next at iter 6.
  EXPECT_EQ(walk(s, {true, false, false, false, false, false, false}),
            (std::vector<double>{8, 8, 8, 16, 16, 16, 32}));
  EXPECT_EQ(s.last_overflow_iter(), 0);
  // Overflow at iter 7 -> 16; the next doubling is at iter 10, not at 9 (the old grid).
  EXPECT_EQ(walk(s, {true, false, false, false}), (std::vector<double>{16, 16, 16, 32}));
}

TEST(ZeroRule, OverflowHalvesAndSaysSoLikeDeepSpeed) {
  DynamicLossScaler s(1024, 1000, 1, 1, false);
  s.update(true);
  EXPECT_EQ(s.scale(), 512);
  EXPECT_EQ(
      s.last_message(),
      "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1024, reducing to 512");
  s.update(false);
  EXPECT_TRUE(s.last_message().empty());
}

TEST(ZeroRule, HysteresisTwoKeepsTheScaleOnTheFirstOverflow) {
  DynamicLossScaler s(1024, 1000, 1, /*hysteresis=*/2, false);
  s.update(true);
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.cur_hysteresis(), 1);
  EXPECT_EQ(s.last_message(),
            "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1024, but "
            "hysteresis is 2. Reducing hysteresis to 1");
  // A clean step inside the window does not refill without consecutive_hysteresis.
  s.update(false);
  EXPECT_EQ(s.cur_hysteresis(), 1);
  EXPECT_EQ(walk(s, {true, true}), (std::vector<double>{512, 256}));
  EXPECT_EQ(s.cur_hysteresis(), 1);
}

TEST(ZeroRule, DoublingRefillsHysteresis) {
  DynamicLossScaler s(64, 2, 1, 2, false);
  // iter 0 overflow: hysteresis 2 -> 1, scale kept; iter 2: (2-0)%2 == 0 doubles and refills;
  // so the overflow at iter 3 again only spends hysteresis; iter 4 overflow halves.
  EXPECT_EQ(walk(s, {true, false, false, true}), (std::vector<double>{64, 64, 128, 128}));
  EXPECT_EQ(s.cur_hysteresis(), 1);
  s.update(true);
  EXPECT_EQ(s.scale(), 64);
}

TEST(ZeroRule, ConsecutiveHysteresisRefillsOnEveryCleanStep) {
  const std::vector<bool> pattern{true, false, true, false, true};
  DynamicLossScaler refilling(1024, 1000, 1, 2, /*consecutive=*/true);
  EXPECT_EQ(walk(refilling, pattern), (std::vector<double>(5, 1024)));
  EXPECT_EQ(refilling.cur_hysteresis(), 1);
  refilling.update(false);
  EXPECT_EQ(refilling.cur_hysteresis(), 2);

  DynamicLossScaler plain(1024, 1000, 1, 2, false);
  EXPECT_EQ(walk(plain, pattern), (std::vector<double>{1024, 1024, 512, 512, 256}));
}

TEST(ZeroRule, FloorIsRespectedThenTheRunStops) {
  DynamicLossScaler s(12, 1000, /*min=*/4, 1, false);
  EXPECT_EQ(walk(s, {true, true}), (std::vector<double>{6, 4}));  // max(3, 4) = 4
  EXPECT_EQ(s.last_message(),
            "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 6, reducing to 4");
  try {
    s.update(true);
    FAIL() << "expected deepspeed::Error at the minimum scale";
  } catch (const deepspeed::Error& e) {
    EXPECT_STREQ(e.what(),
                 "Current loss scale already at minimum - cannot decrease scale anymore. "
                 "Exiting run.");
  }
  EXPECT_EQ(s.scale(), 4);
}

TEST(ZeroRule, HysteresisIsSpentBeforeTheFloorCheck) {
  DynamicLossScaler s(1, 1000, 1, 3, false);
  s.update(true);
  s.update(true);
  EXPECT_EQ(s.scale(), 1);
  EXPECT_EQ(s.cur_hysteresis(), 1);
  EXPECT_THROW(s.update(true), deepspeed::Error);
}

TEST(ZeroRule, FractionalScalesKeepTheirDigitsInTheMessage) {
  DynamicLossScaler s(1, 1000, 0.25, 1, false);
  s.update(true);
  EXPECT_EQ(s.scale(), 0.5);
  EXPECT_EQ(s.last_message(),
            "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1, reducing to 0.5");
}

// min_loss_scale 0 (DeepSpeed-Chat's): every overflow halves, but the scale stops at 2^-126,
// where its inverse (what the gradients are multiplied by, in fp32) is still finite; then the
// ZeRO rule stops the run as at any floor. Never 0, never a NaN from 0 * inf.
TEST(ZeroRule, MinScaleZeroHalvesDownTo2PowMinus126ThenStops) {
  DynamicLossScaler s(4, 1000, /*min=*/0, 1, false);
  for (int i = 1; i <= 128; ++i) {
    s.update(true);
    ASSERT_EQ(s.scale(), std::ldexp(1.0, 2 - i)) << "overflow " << i;
    ASSERT_TRUE(std::isfinite(static_cast<float>(1.0 / s.scale()))) << "overflow " << i;
  }
  EXPECT_EQ(s.scale(), std::ldexp(1.0, -126));
  try {
    s.update(true);
    FAIL() << "expected deepspeed::Error at the lowest scale";
  } catch (const deepspeed::Error& e) {
    EXPECT_CONTAINS(e.what(), "Current loss scale already at minimum");
    EXPECT_CONTAINS(e.what(), "fp16.min_loss_scale = 0");
  }
  EXPECT_EQ(s.scale(), std::ldexp(1.0, -126));
}

TEST(Fp16OptimizerRule, MinScaleZeroStaysAt2PowMinus126) {
  DynamicLossScaler s(1, 1000, 0, 1, false, ScaleRule::kFp16Optimizer);
  EXPECT_EQ(walk(s, std::vector<bool>(200, true)).back(), std::ldexp(1.0, -126));
  EXPECT_TRUE(std::isfinite(static_cast<float>(1.0 / s.scale())));
}

// ---- FP16_Optimizer rule (no ZeRO) --------------------------------------------------------------

TEST(Fp16OptimizerRule, DoublesOneStepLaterThanZero) {
  // stable = cur_iter - (-1) - 1 = cur_iter: doubles at iters 4 and 8 (ZeRO: 3 and 7).
  DynamicLossScaler s(8, 4, 1, 1, false, ScaleRule::kFp16Optimizer);
  EXPECT_EQ(walk(s, clean(9)), (std::vector<double>{8, 8, 8, 8, 16, 16, 16, 16, 32}));
}

TEST(Fp16OptimizerRule, WindowAfterOverflowAndNoHysteresis) {
  DynamicLossScaler s(64, 2, 1, 1, false, ScaleRule::kFp16Optimizer);
  // Overflow at iter 0 -> 32; stable = iter - 1 -> doubles at iter 3 (stable 2).
  EXPECT_EQ(walk(s, {true, false, false, false, false, false}),
            (std::vector<double>{32, 32, 32, 64, 64, 128}));
}

TEST(Fp16OptimizerRule, StaysAtTheFloorWithoutThrowing) {
  DynamicLossScaler s(2, 1000, 1, 1, false, ScaleRule::kFp16Optimizer);
  EXPECT_EQ(walk(s, {true, true, true}), (std::vector<double>{1, 1, 1}));
  EXPECT_EQ(s.last_message(),
            "Overflow detected. Skipping step. Attempted loss scale: 1, reducing to 1");
}

// ---- static -------------------------------------------------------------------------------------

TEST(StaticScaler, NeverMoves) {
  StaticLossScaler s(128);
  EXPECT_FALSE(s.dynamic());
  EXPECT_EQ(walk(s, {true, false, true, true, false}), (std::vector<double>(5, 128)));
  EXPECT_TRUE(s.last_message().empty());
}

// Each message names the key and the value at fault (a swapped key in a check shows here).
TEST(Construction, BadArgumentsNameTheKey) {
  EXPECT_CONTAINS(dstest::message_of<ConfigError>([] { StaticLossScaler(0); }),
                  "fp16.loss_scale = 0: expected a finite value > 0");
  EXPECT_CONTAINS(dstest::message_of<ConfigError>([] { DynamicLossScaler(0, 10, 1, 1, false); }),
                  "fp16 initial loss scale (2^fp16.initial_scale_power) = 0");
  EXPECT_CONTAINS(dstest::message_of<ConfigError>([] { DynamicLossScaler(8, 0, 1, 1, false); }),
                  "fp16.loss_scale_window = 0: expected >= 1");
  EXPECT_CONTAINS(dstest::message_of<ConfigError>([] { DynamicLossScaler(8, 10, -1, 1, false); }),
                  "fp16.min_loss_scale = -1: expected a finite value >= 0");
  EXPECT_NO_THROW(DynamicLossScaler(8, 10, 0, 1, false));  // DeepSpeed's "no floor"
  EXPECT_CONTAINS(dstest::message_of<ConfigError>([] { DynamicLossScaler(8, 10, 1, 0, false); }),
                  "fp16.hysteresis = 0: expected >= 1");
}

// ---- factory ------------------------------------------------------------------------------------

Fp16Config fp16_on() {
  Fp16Config c;
  c.enabled = true;
  return c;
}

void expect_dynamic(const LossScaler& s, double scale, int64_t window, double min, int hysteresis,
                    bool consecutive, ScaleRule rule) {
  ASSERT_TRUE(s.dynamic());
  const auto& d = as_dynamic(s);
  EXPECT_EQ(d.scale(), scale);
  EXPECT_EQ(d.scale_window(), window);
  EXPECT_EQ(d.min_scale(), min);
  EXPECT_EQ(d.hysteresis(), hysteresis);
  EXPECT_EQ(d.cur_hysteresis(), hysteresis);
  EXPECT_EQ(d.consecutive_hysteresis(), consecutive);
  EXPECT_EQ(d.rule(), rule);
}

TEST(Factory, PositiveLossScaleIsStatic) {
  Fp16Config c = fp16_on();
  c.loss_scale = 128;
  c.dynamic_keys_given = true;  // ignored: a static scale wins
  for (auto wrapper : {Fp16Wrapper::kZero, Fp16Wrapper::kFused, Fp16Wrapper::kUnfused}) {
    auto s = make_loss_scaler(c, wrapper);
    EXPECT_FALSE(s->dynamic());
    EXPECT_EQ(s->scale(), 128);
  }
}

TEST(Factory, ZeroWithoutKeysUsesItsOwnDefaults) {
  Fp16Config c = fp16_on();  // struct defaults (hysteresis 2, power 16) must NOT reach the scaler
  expect_dynamic(*make_loss_scaler(c, Fp16Wrapper::kZero), std::ldexp(1.0, 32), 1000, 1, 1, false,
                 ScaleRule::kZero);
}

TEST(Factory, ZeroWithKeysUsesThem) {
  Fp16Config c = fp16_on();
  c.dynamic_keys_given = true;
  c.initial_scale_power = 8;
  c.loss_scale_window = 50;
  c.min_loss_scale = 0.5;
  c.hysteresis = 3;
  c.consecutive_hysteresis = true;
  expect_dynamic(*make_loss_scaler(c, Fp16Wrapper::kZero), 256, 50, 0.5, 3, true, ScaleRule::kZero);
}

// DeepSpeed-Chat's block: {"enabled": true, "loss_scale_window": 100, "min_loss_scale": 0}.
TEST(Factory, DeepSpeedChatMinLossScaleZeroReachesTheScaler) {
  Fp16Config c = fp16_on();
  c.dynamic_keys_given = true;
  c.loss_scale_window = 100;
  c.min_loss_scale = 0;
  expect_dynamic(*make_loss_scaler(c, Fp16Wrapper::kZero), 65536, 100, 0, 2, false,
                 ScaleRule::kZero);
  expect_dynamic(*make_loss_scaler(c, Fp16Wrapper::kFused), 65536, 100, 0, 1, false,
                 ScaleRule::kFp16Optimizer);
}

TEST(Factory, NoZeroWithoutKeysIsFp16OptimizerDefaults) {
  expect_dynamic(*make_loss_scaler(fp16_on(), Fp16Wrapper::kFused), 65536, 1000, 1, 1, false,
                 ScaleRule::kFp16Optimizer);
}

// FP16_UnfusedOptimizer (SGD, Adagrad, Lamb, a client optimizer, torch_adam) floors at 0.25.
TEST(Factory, NoZeroUnfusedWithoutKeysFloorsAtAQuarter) {
  expect_dynamic(*make_loss_scaler(fp16_on(), Fp16Wrapper::kUnfused), 65536, 1000, 0.25, 1, false,
                 ScaleRule::kFp16UnfusedOptimizer);
}

// FP16_UnfusedOptimizer (stage 0 with SGD, Adagrad, Lamb, a client optimizer) moves the scale by
// the same rule and logs its own line (unfused_optimizer.py's step()), not the fused one's.
TEST(Factory, TheUnfusedWrapperLogsItsOwnOverflowLine) {
  auto s = make_loss_scaler(fp16_on(), Fp16Wrapper::kUnfused);
  s->update(true);
  EXPECT_EQ(s->scale(), 32768);
  EXPECT_EQ(s->last_message(),
            "[deepspeed] fp16 dynamic loss scale overflow! Skipping step. Attempted loss scale: "
            "65536, reducing to 32768");
  auto fused = make_loss_scaler(fp16_on(), Fp16Wrapper::kFused);
  fused->update(true);
  EXPECT_EQ(fused->last_message(),
            "Overflow detected. Skipping step. Attempted loss scale: 65536, reducing to 32768");
}

TEST(Factory, NoZeroWithKeysTakesScaleWindowMinButNoHysteresis) {
  Fp16Config c = fp16_on();
  c.dynamic_keys_given = true;
  c.initial_scale_power = 10;
  c.loss_scale_window = 20;
  c.min_loss_scale = 4;
  c.hysteresis = 3;
  c.consecutive_hysteresis = true;
  expect_dynamic(*make_loss_scaler(c, Fp16Wrapper::kUnfused), 1024, 20, 4, 1, false,
                 ScaleRule::kFp16UnfusedOptimizer);
}

TEST(Factory, Fp16OffIsScaleOne) {
  auto s = make_loss_scaler(Fp16Config{}, Fp16Wrapper::kZero);
  EXPECT_FALSE(s->dynamic());
  EXPECT_EQ(s->scale(), 1);
}

// ---- state round trip ---------------------------------------------------------------------------

// Runs `prefix`, saves through text, restores two ways, then checks every later step matches.
void expect_round_trip(DynamicLossScaler original, const std::vector<bool>& prefix,
                       const std::vector<bool>& suffix) {
  walk(original, prefix);
  const auto text = original.state_dict().dump();
  auto restored = loss_scaler_from_state_dict(nlohmann::json::parse(text));
  DynamicLossScaler loaded(1, 1, 1, 1, false);
  loaded.load_state_dict(nlohmann::json::parse(text));
  for (size_t i = 0; i < suffix.size(); ++i) {
    original.update(suffix[i]);
    restored->update(suffix[i]);
    loaded.update(suffix[i]);
    ASSERT_EQ(restored->scale(), original.scale()) << "step " << i;
    ASSERT_EQ(loaded.scale(), original.scale()) << "step " << i;
    ASSERT_EQ(restored->last_message(), original.last_message()) << "step " << i;
  }
  EXPECT_EQ(loaded.state_dict(), original.state_dict());
}

TEST(StateDict, DynamicRoundTripContinuesTheSameSequence) {
  // Stopped mid-window and with hysteresis partly spent, the two easy states to lose.
  const std::vector<bool> prefix{false, true, false, false, true, false};
  const std::vector<bool> suffix{false, false, true,  true,  false, false, false,
                                 false, true,  false, false, false, false, false};
  expect_round_trip(DynamicLossScaler(std::ldexp(1.0, 20), 3, 1, 2, false), prefix, suffix);
  expect_round_trip(DynamicLossScaler(std::ldexp(1.0, 20), 3, 1, 3, true), prefix, suffix);
  expect_round_trip(DynamicLossScaler(1024, 3, 1, 1, false, ScaleRule::kFp16Optimizer), prefix,
                    suffix);
  expect_round_trip(DynamicLossScaler(1024, 3, 1, 1, false, ScaleRule::kFp16UnfusedOptimizer),
                    prefix, suffix);
}

TEST(StateDict, ExactScaleSurvivesText) {
  DynamicLossScaler s(std::ldexp(1.0, 32), 1000, 1, 1, false);
  auto restored = loss_scaler_from_state_dict(nlohmann::json::parse(s.state_dict().dump()));
  EXPECT_EQ(restored->scale(), 4294967296.0);
}

TEST(StateDict, StaticRoundTrip) {
  StaticLossScaler s(64);
  auto restored = loss_scaler_from_state_dict(s.state_dict());
  EXPECT_FALSE(restored->dynamic());
  EXPECT_EQ(restored->scale(), 64);
  StaticLossScaler other(2);
  other.load_state_dict(s.state_dict());
  EXPECT_EQ(other.scale(), 64);
}

TEST(StateDict, WrongKindOrMissingKeyIsACheckpointError) {
  DynamicLossScaler d(8, 10, 1, 2, false);
  StaticLossScaler st(8);
  EXPECT_THROW(d.load_state_dict(st.state_dict()), CheckpointError);
  EXPECT_THROW(st.load_state_dict(d.state_dict()), CheckpointError);
  auto broken = d.state_dict();
  broken.erase("cur_iter");
  try {
    d.load_state_dict(broken);
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("cur_iter"), std::string::npos);
  }
  EXPECT_EQ(d.cur_hysteresis(), 2);  // untouched by the failed load
  auto bad_window = d.state_dict();
  bad_window["scale_window"] = 0;
  EXPECT_THROW(d.load_state_dict(bad_window), CheckpointError);
  EXPECT_THROW(loss_scaler_from_state_dict(nlohmann::json::object()), CheckpointError);
}

// ---- has_inf_or_nan -----------------------------------------------------------------------------

TEST(HasInfOrNan, Float32) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(has_inf_or_nan(torch::tensor({1.0f, -2.0f, 3e38f})));
  EXPECT_TRUE(has_inf_or_nan(torch::tensor({1.0f, inf, 3.0f})));
  EXPECT_TRUE(has_inf_or_nan(torch::tensor({1.0f, -inf})));
  EXPECT_TRUE(has_inf_or_nan(torch::tensor({nan, 0.0f})));
  EXPECT_FALSE(has_inf_or_nan(torch::empty({0})));
  EXPECT_FALSE(has_inf_or_nan(torch::zeros({4, 0, 3})));
}

TEST(HasInfOrNan, FiniteValuesWhoseSumOverflowsAreFinite) {
  EXPECT_FALSE(has_inf_or_nan(torch::tensor({3e38f, 3e38f, 3e38f})));
  EXPECT_FALSE(has_inf_or_nan(torch::tensor({-3e38f, -3e38f})));
  EXPECT_TRUE(
      has_inf_or_nan(torch::tensor({3e38f, 3e38f, std::numeric_limits<float>::quiet_NaN()})));
  EXPECT_FALSE(has_inf_or_nan(torch::tensor({1e308, 1e308}, torch::kDouble)));
  EXPECT_TRUE(has_inf_or_nan(torch::tensor({1.0, -std::numeric_limits<double>::infinity()})));
}

TEST(HasInfOrNan, LargeAndStrided) {
  auto t = torch::ones({1000, 37});
  EXPECT_FALSE(has_inf_or_nan(t));
  t.index_put_({999, 36}, std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(has_inf_or_nan(t));
  EXPECT_TRUE(has_inf_or_nan(t.t()));                 // non-contiguous view
  EXPECT_FALSE(has_inf_or_nan(t.narrow(0, 0, 999)));  // the NaN row excluded
  EXPECT_TRUE(has_inf_or_nan(t.narrow(1, 36, 1)));
}

TEST(HasInfOrNan, SixteenBitTypes) {
  for (auto dtype : {torch::kHalf, torch::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    EXPECT_FALSE(has_inf_or_nan(torch::tensor({1.0f, -3.5f}).to(dtype)));
    EXPECT_TRUE(has_inf_or_nan(torch::tensor({1.0f, INFINITY}).to(dtype)));
    EXPECT_TRUE(has_inf_or_nan(torch::tensor({-INFINITY}).to(dtype)));
    EXPECT_TRUE(has_inf_or_nan(torch::tensor({NAN, 2.0f}).to(dtype)));
    EXPECT_FALSE(has_inf_or_nan(torch::empty({0}, dtype)));
  }
  // The fp16 maximum is finite; one step above it rounds to inf (the overflow fp16 training sees).
  EXPECT_FALSE(has_inf_or_nan(torch::tensor({65504.0f}).to(torch::kHalf)));
  EXPECT_TRUE(has_inf_or_nan(torch::tensor({70000.0f}).to(torch::kHalf)));
}

TEST(HasInfOrNan, IntegerTensorsAreNeverNonFinite) {
  EXPECT_FALSE(has_inf_or_nan(torch::tensor({1, 2, 3})));
  EXPECT_FALSE(has_inf_or_nan(torch::tensor({true, false})));
}

}  // namespace

}  // namespace loss_scaler_test
