// Issue 18's bar: every communication-saving optimizer trains the example GPT (the test-sized
// one, support/training_run.h) to within 5% of its uncompressed counterpart's loss after 200
// steps, on 2 ranks. The loss compared is the mean of steps 181-200 (single steps of 2 x 2
// samples are noisy). Counterparts are the same update without compression: Adam without bias
// correction for the 1-bit Adams (they never bias-correct), Lamb without bias correction for
// 1-bit Lamb, and Lamb itself against AdamW. β2 = 0.99 as DeepSpeed's tutorials suggest; with
// β2 = 0.999 and no bias correction the variance frozen after 50 steps is ~5% of its value
// (1 - β2^50) and every compressed method overshoots (docs/benchmarks.md has the figures).
// The 1-bit optimizers get DeepSpeed's exp_avg_mask on the attention key biases, whose gradient
// is zero (without it 1-bit Lamb ends 21% behind: the compressed exchange invents momentum there
// and the frozen ~zero variance turns it into steps of thousands).
//
// Settings, and why they are not DeepSpeed's defaults (the update rules equal DeepSpeed's
// formulas done by hand: zero_one_adam_test and onebit_lamb_test; the gaps are the algorithms'
// on a 200-step run, figures in docs/benchmarks.md):
//  - 0/1 Adam: var_update_scaler 32, local_step_scaler 8, local_step_clipper 4 (+2.6%). At the
//    default scaler 16 the variance interval doubles at step 16, so steps 17-51 alternate with
//    1-bit compressed *gradients* against a variance of only 16 updates; the loss jumps from 3.7
//    to 4.7 around step 25 and the run ends +12.6% (+0.7% at 32 without local steps). Scaler 32
//    still runs 10 compressed-gradient steps (33-51, odd) and then local steps up to 4 in a row.
//  - 1-bit Lamb: freeze_step 100, a 50% warm-up (+4.6%). At 25% (freeze_step 50) it ends +9.2%:
//    Lamb is still in its fast descent at step 50 (loss 4.76 of 5.42), and the frozen ratio
//    average then gives smaller steps than Lamb's live trust ratio (+7.9% even with the factor
//    pinned at 1, so it is not the factor clamp); 80: +8.2%, 120: +1.1%.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "support/training_run.h"

namespace optimizer_convergence_test {

using dstest::base_config;
using dstest::RunSpec;
using nlohmann::json;

namespace {

constexpr int kSteps = 200, kWarmup = 50;

double trained_loss(const json& optimizer) {
  RunSpec s;
  s.world_size = 2;
  s.steps = kSteps;
  s.config = base_config(2, 1, 0);
  s.config["optimizer"] = optimizer;
  const std::string type = optimizer.at("type");
  if (type != "Adam" && type != "AdamW" && type != "Lamb")
    s.before_training = dstest::mask_attention_key_biases;
  return dstest::tail_mean(dstest::train_gpt(s).losses, 20);
}

json adam_like(const std::string& type, json extra) {
  json params = {{"lr", 3e-3}, {"betas", {0.9, 0.99}}, {"weight_decay", 0.01}};
  params.update(extra);
  return {{"type", type}, {"params", params}};
}

json lamb_like(const std::string& type, json extra) {
  json params = {{"lr", 0.01}, {"betas", {0.9, 0.99}}, {"weight_decay", 0.01}};
  params.update(extra);
  return {{"type", type}, {"params", params}};
}

void expect_within(double bound, const std::string& name, double loss, const std::string& peer_name,
                   double peer) {
  std::cout << name << ": " << loss << " vs " << peer_name << " " << peer << " ("
            << (loss - peer) / peer * 100 << "%)\n";
  EXPECT_LT(std::abs(loss - peer) / peer, bound) << name;
}

}  // namespace

TEST(OptimizerConvergence, OneBitAdamsAgainstAdamAfter200Steps) {
  const double adam = trained_loss(adam_like("Adam", {{"bias_correction", false}}));
  const double onebit = trained_loss(adam_like("OneBitAdam", {{"freeze_step", kWarmup}}));
  const double zero_one = trained_loss(adam_like("ZeroOneAdam", {{"var_freeze_step", kWarmup},
                                                                  {"var_update_scaler", 32},
                                                                  {"local_step_scaler", 8},
                                                                  {"local_step_clipper", 4}}));
  expect_within(0.05, "1-bit Adam", onebit, "Adam", adam);
  expect_within(0.05, "0/1 Adam", zero_one, "Adam", adam);
}

TEST(OptimizerConvergence, LambsAgainstLambAndAdamWAfter200Steps) {
  const double lamb = trained_loss(lamb_like("Lamb", {{"bias_correction", false}}));
  const double onebit = trained_loss(lamb_like("OneBitLamb", {{"freeze_step", 2 * kWarmup}}));
  const double adamw = trained_loss(adam_like("AdamW", json::object()));
  expect_within(0.05, "1-bit Lamb", onebit, "Lamb", lamb);
  expect_within(0.05, "Lamb", lamb, "AdamW (bias-corrected)", adamw);
}

}  // namespace optimizer_convergence_test
