// 1-bit Lamb in fp16 (stage 0: zero/flat_stage.h steps one flat fp32 master, optim/onebit_lamb.h
// runs its per-parameter arithmetic on one segment per parameter):
//   - segments of one flat tensor step exactly as separate tensors, on 2 ranks, warm-up and
//     compressed phase (trust ratios, running ratio averages, factors, fresh variance, the
//     compressed exchange one scale set per segment);
//   - through the engine in fp16 the warm-up is 16-bit Lamb without bias correction bit for bit;
//     training follows an fp32 1-bit Lamb run of the same model within fp16's rounding, with no
//     gradient all-reduce after the freeze and identical weights on the ranks;
//   - one rank's inf gradient after the freeze makes every rank skip the step and leave the
//     1-bit Lamb state (step count, momentum, ratios, factors) untouched and equal;
//   - a checkpoint saved in the warm-up or after the freeze resumes bit for bit;
//   - after 200 steps the loss is within 5% of Lamb's (Adam's printed);
//   - bf16 and a static fp16 loss scale are refused, as DeepSpeed asserts dynamic loss scaling.
// The fp16 model is support/half_mlp.h (fp16 parameters, fp32 compute: libtorch 1.13 has no CPU
// Half LayerNorm for the GPT).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "deepspeed/config.h"
#include "deepspeed/errors.h"
#include "optim/adamw_state.h"
#include "optim/onebit_lamb.h"
#include "support/files.h"
#include "support/half_mlp.h"
#include "support/ranks.h"
#include "support/training_run.h"
#include "util/torch_compat.h"

namespace onebit_lamb_16bit_test {

using deepspeed::optim::OneBitLamb;
using dstest::HalfMlp;
using dstest::HalfMlpImpl;
using nlohmann::json;

namespace {

json mlp_config(const std::string& type, const json& params, bool fp16 = true) {
  json c = dstest::base_config(8, 1, 0);
  json p = {{"lr", 0.02}, {"betas", {0.9, 0.99}}, {"weight_decay", 0.01}};
  p.update(params);
  c["optimizer"] = {{"type", type}, {"params", p}};
  if (fp16) c["fp16"] = {{"enabled", true}, {"initial_scale_power", 8}};
  return c;
}

double sum_of(const std::vector<at::Tensor>& ts) {
  double s = 0;
  for (const auto& t : ts) s += t.to(torch::kDouble).sum().item<double>();
  return s;
}

// Everything 1-bit Lamb keeps that must agree across ranks, as one number per kind.
std::vector<double> lamb_state_sums(const OneBitLamb& opt) {
  std::vector<at::Tensor> m, v;
  for (const auto& p : deepspeed::optim::params_of(opt)) {
    auto it = opt.state().find(deepspeed::compat::optimizer_state_key(p));
    if (it == opt.state().end()) continue;
    auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
    m.push_back(s.exp_avg());
    v.push_back(s.exp_avg_sq());
  }
  double cf = 0, lf = 0, lc = 0;
  for (double x : opt.coeff_freeze()) cf += x;
  for (double x : opt.last_factor()) lf += x;
  for (double x : opt.lamb_coeffs()) lc += x;
  return {static_cast<double>(opt.steps()), sum_of(m), sum_of(v), cf, lf, lc};
}

// What rank 0 saw in each step, and the spread of the ranks' values.
struct StepRecord {
  double loss = 0;
  bool gradient_all_reduce = false;  // an all-reduce larger than the vote's and the records'
  int64_t all_to_all = 0;
  bool applied = false, applied_anywhere = false;
  double loss_scale_spread = -1, weight_spread = -1, state_spread = -1;
  std::vector<double> state;  // lamb_state_sums on rank 0 (empty for another optimizer)
};

void record(deepspeed::Engine& engine, deepspeed::comm::Communicator& comm,
            torch::nn::Module& model, StepRecord& rec) {
  rec.loss = engine.last_loss();
  for (auto& [op, st] : comm.stats()) {
    if (op == "all_to_all") rec.all_to_all = st.calls;
    if (op == "all_reduce" && st.bytes > 64) rec.gradient_all_reduce = true;
  }
  std::vector<double> values = {sum_of(model.parameters()), engine.loss_scale(),
                                engine.was_step_applied() ? 1.0 : 0.0};
  if (auto opt = std::dynamic_pointer_cast<OneBitLamb>(engine.optimizer())) {
    rec.state = lamb_state_sums(*opt);
    values.insert(values.end(), rec.state.begin(), rec.state.end());
  }
  auto hi = torch::tensor(values, torch::kDouble), lo = hi.clone();
  comm.all_reduce(hi, deepspeed::comm::ReduceOp::Max)->wait();
  comm.all_reduce(lo, deepspeed::comm::ReduceOp::Min)->wait();
  auto spread = (hi - lo).abs();
  rec.weight_spread = spread[0].item<double>();
  rec.loss_scale_spread = spread[1].item<double>();
  rec.applied = lo[2].item<double>() == 1.0;
  rec.applied_anywhere = hi[2].item<double>() == 1.0;
  rec.state_spread = values.size() > 3 ? spread.narrow(0, 3, values.size() - 3).max().item<double>() : 0;
}

struct MlpRun {
  std::vector<StepRecord> steps;
  std::vector<at::Tensor> weights;  // rank 0's, fp32
};

// HalfMlp on 2 ranks for steps first_step .. last_step (batches depend on rank and step). Before
// step `poison_step` rank 1 puts an inf into a gradient. With `load_dir` the engines first load
// the latest checkpoint there; with `save_dir` they save after step `save_at`.
struct MlpJob {
  json config;
  int first_step = 1, last_step = 8, poison_step = 0, save_at = 0;
  std::string load_dir, save_dir;
  double label_noise = 0;  // std of Gaussian noise added to the targets: a loss floor of its square
  uint64_t noise_seed = 20000;
};

// Models and batches are drawn before the rank threads start: torch's default generator is
// process-wide, and seeding it from two threads at once would make the runs differ.
MlpRun train_mlp(const MlpJob& job) {
  MlpRun out;
  out.steps.resize(job.last_step - job.first_step + 1);
  std::vector<HalfMlp> models;
  std::vector<std::vector<dstest::HalfMlpBatch>> batches(2);
  for (int r = 0; r < 2; ++r) {
    torch::manual_seed(job.load_dir.empty() ? 5 : 99);  // a resumed job: loading must win
    models.push_back(HalfMlp());
    for (int s = job.first_step; s <= job.last_step; ++s)
      batches[r].push_back(dstest::half_mlp_batch(r, s));
    for (int s = job.first_step; s <= job.last_step; ++s) {
      auto& y = batches[r][s - job.first_step].y;
      auto gen = at::detail::createCPUGenerator(job.noise_seed + 100 * s + r);
      y = y + torch::randn(y.sizes(), gen) * job.label_noise;
    }
  }
  dstest::run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    const int rank = comm->rank();
    auto& model = models[rank];
    auto r = deepspeed::initialize<HalfMlpImpl>(
        {.model = model.ptr(), .config_json = job.config, .comm = comm});
    if (!job.load_dir.empty()) r.engine->load_checkpoint(job.load_dir);
    for (int s = job.first_step; s <= job.last_step; ++s) {
      const auto& batch = batches[rank][s - job.first_step];
      comm->reset_stats();
      r.engine->backward(r.engine->forward(batch.x, batch.y));
      if (s == job.poison_step && rank == 1) {
        torch::NoGradGuard no_grad;
        model->w1.grad().view({-1})[0].fill_(std::numeric_limits<float>::infinity());
      }
      r.engine->step();
      StepRecord rec;
      record(*r.engine, *comm, *model, rec);
      if (rank == 0) out.steps[s - job.first_step] = rec;
      if (s == job.save_at) r.engine->save_checkpoint(job.save_dir);
    }
    if (rank == 0)
      for (auto& p : model->parameters()) out.weights.push_back(p.detach().to(torch::kFloat).clone());
  });
  return out;
}

std::vector<double> losses(const MlpRun& run) {
  std::vector<double> out;
  for (const auto& s : run.steps) out.push_back(s.loss);
  return out;
}

std::string config_error(const json& doc) {
  try {
    deepspeed::parse_config(doc, 2);
  } catch (const deepspeed::ConfigError& e) {
    return e.what();
  }
  return "<no ConfigError>";
}

}  // namespace

// Three parameters laid out in one 64-element tensor with padding between them (as FlatParams
// aligns them), against the same parameters as separate tensors, each rank with its own
// gradients: 3 Lamb warm-up steps, then 5 compressed steps (2 ranks, so the exchange averages).
// The only difference allowed is the warm-up norm's summation (Lamb's fragmented step sums
// squares, the per-tensor one calls norm()): measured 0 here; asserted 1e-6.
TEST(OneBitLamb16Bit, SegmentsOfOneFlatTensorStepAsSeparateTensors) {
  const std::vector<int64_t> sizes = {5, 37, 16}, offsets = {0, 8, 48};
  const int64_t flat_numel = 64;
  deepspeed::optim::OneBitLambHyper h;
  h.lr = 0.01;
  h.weight_decay = 0.01;
  h.freeze_step = 3;
  dstest::run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    torch::manual_seed(3);
    std::vector<at::Tensor> separate;
    for (int64_t n : sizes) separate.push_back(torch::randn({n}));
    at::Tensor flat = torch::zeros({flat_numel});
    std::vector<deepspeed::optim::Lamb::Fragment> fragments;
    std::vector<std::pair<int64_t, int64_t>> segments;
    for (size_t i = 0; i < sizes.size(); ++i) {
      flat.narrow(0, offsets[i], sizes[i]).copy_(separate[i]);
      fragments.push_back({static_cast<int64_t>(i), offsets[i], sizes[i]});
      segments.emplace_back(offsets[i], sizes[i]);
    }
    OneBitLamb a(separate, h, comm), b({flat}, h, comm);
    b.set_fragments(fragments, static_cast<int64_t>(sizes.size()), nullptr);
    b.set_segments(separate, segments);
    for (int step = 1; step <= 8; ++step) {
      torch::manual_seed(100 * step + comm->rank());
      at::Tensor flat_grad = torch::zeros({flat_numel});
      for (size_t i = 0; i < sizes.size(); ++i) {
        separate[i].mutable_grad() = torch::randn({sizes[i]}) * 0.1;
        flat_grad.narrow(0, offsets[i], sizes[i]).copy_(separate[i].grad());
      }
      flat.mutable_grad() = flat_grad;
      a.step();
      b.step();
      double worst = 0;
      for (size_t i = 0; i < sizes.size(); ++i) {
        worst = std::max(worst, (flat.narrow(0, offsets[i], sizes[i]) - separate[i])
                                    .abs().max().item<double>());
        EXPECT_NEAR(a.lamb_coeffs()[i], b.lamb_coeffs()[i], 1e-6) << "step " << step;
        EXPECT_NEAR(a.coeff_freeze()[i], b.coeff_freeze()[i], 1e-6) << "step " << step;
        EXPECT_NEAR(a.last_factor()[i], b.last_factor()[i], 1e-6) << "step " << step;
      }
      EXPECT_LT(worst, 1e-6) << "step " << step << " rank " << comm->rank();
      // The padding is in no segment: never updated.
      EXPECT_EQ(flat.narrow(0, 5, 3).abs().max().item<double>(), 0.0) << "step " << step;
    }
    EXPECT_TRUE(b.frozen());
    ASSERT_NE(b.compressor(), nullptr);
    // The ratios differ per parameter, so one shared ratio could not have passed.
    EXPECT_NE(b.coeff_freeze()[0], b.coeff_freeze()[1]);
    EXPECT_NE(b.lamb_coeffs()[1], b.lamb_coeffs()[2]);
  });
}

// freeze_step beyond the run: every step is the warm-up, Lamb's fragmented step on the master.
TEST(OneBitLamb16Bit, Fp16WarmupIsFp16LambWithoutBiasCorrectionBitForBit) {
  MlpJob onebit, lamb;
  onebit.config = mlp_config("OneBitLamb", {{"freeze_step", 1000}});
  lamb.config = mlp_config("Lamb", {{"bias_correction", false}});
  onebit.last_step = lamb.last_step = 6;
  auto a = train_mlp(onebit), b = train_mlp(lamb);
  EXPECT_EQ(losses(a), losses(b));
  EXPECT_EQ(dstest::max_abs_diff(a.weights, b.weights), 0.0);
  EXPECT_LT(a.steps.back().loss, a.steps.front().loss);
}

// freeze_step 4 of 16 steps, fp16 against the same net in fp32 (1-bit Lamb per tensor,
// zero/data_parallel.h). fp16 rounds the weights to 11 significant bits and the compressed
// exchange amplifies that through the signs; measured: largest relative loss difference 3.2e-4
// in the warm-up and 1.6e-3 after; asserted 2e-3 and 1e-2.
TEST(OneBitLamb16Bit, Fp16FollowsFp32AndKeepsGradientsLocalAfterTheFreeze) {
  MlpJob fp16, fp32;
  fp16.config = mlp_config("OneBitLamb", {{"freeze_step", 4}});
  fp32.config = mlp_config("OneBitLamb", {{"freeze_step", 4}}, /*fp16=*/false);
  fp16.last_step = fp32.last_step = 16;
  auto a = train_mlp(fp16), b = train_mlp(fp32);
  double warm = 0, frozen = 0;
  for (int s = 1; s <= 16; ++s) {
    const double d = std::abs(a.steps[s - 1].loss - b.steps[s - 1].loss) / b.steps[s - 1].loss;
    (s <= 4 ? warm : frozen) = std::max(s <= 4 ? warm : frozen, d);
  }
  std::cout << "fp16 vs fp32 1-bit Lamb, largest relative loss difference: warm-up " << warm
            << ", frozen " << frozen << "; loss step 1 " << a.steps[0].loss << ", step 16 "
            << a.steps[15].loss << " (fp32 " << b.steps[15].loss << ")\n";
  EXPECT_LT(warm, 2e-3);
  EXPECT_LT(frozen, 1e-2);
  EXPECT_LT(a.steps[15].loss, 0.7 * a.steps[0].loss);
  for (int s = 1; s <= 16; ++s) {
    const auto& r = a.steps[s - 1];
    EXPECT_EQ(r.gradient_all_reduce, s <= 4) << "step " << s;
    EXPECT_EQ(r.all_to_all, s > 4 ? 1 : 0) << "step " << s;
    EXPECT_EQ(r.weight_spread, 0.0) << "step " << s;
    EXPECT_EQ(r.state_spread, 0.0) << "step " << s;
    EXPECT_TRUE(r.applied) << "step " << s;
  }
}

// Frozen after step 2; rank 1's gradient gets an inf before step 4, when gradients are local:
// every rank skips (the stage's overflow vote), the scales stay equal, and the 1-bit Lamb state
// is the one step 3 left, on every rank.
TEST(OneBitLamb16Bit, Fp16InfOnOneRankSkipsTheStepAndTheStateOnEveryRank) {
  MlpJob job;
  job.config = mlp_config("OneBitLamb", {{"freeze_step", 2}});
  job.last_step = 6;
  job.poison_step = 4;
  auto run = train_mlp(job);
  for (int s = 1; s <= 6; ++s) {
    const auto& r = run.steps[s - 1];
    EXPECT_EQ(r.applied, s != 4) << "step " << s;
    EXPECT_EQ(r.applied_anywhere, s != 4) << "step " << s;
    EXPECT_EQ(r.loss_scale_spread, 0.0) << "step " << s;
    EXPECT_EQ(r.weight_spread, 0.0) << "step " << s;
    EXPECT_EQ(r.state_spread, 0.0) << "step " << s;
    EXPECT_EQ(r.gradient_all_reduce, s <= 2) << "step " << s;
  }
  EXPECT_EQ(run.steps[3].all_to_all, 0);  // the skipped step exchanged nothing
  EXPECT_EQ(run.steps[4].all_to_all, 1);
  EXPECT_EQ(run.steps[3].state, run.steps[2].state);  // untouched by the skipped step
  EXPECT_EQ(run.steps[3].state[0], 3.0);              // three steps taken
  EXPECT_EQ(run.steps[5].state[0], 5.0);
}

// freeze_step 3; saved at step 2 (warm-up) or 5 (after the freeze: fresh variance, ratio
// averages, factors and error feedback in the extra state), resumed on 2 ranks to step 9.
// factor_threshold 0.01 makes the per-step clamp bind, so the resumed run depends on the saved
// last factors too (at 0.1 the factors here move less than the clamp and a lost last factor
// would go unseen).
TEST(OneBitLamb16Bit, Fp16CheckpointResumesBitExact) {
  const json config = mlp_config("OneBitLamb", {{"freeze_step", 3}, {"factor_threshold", 0.01}});
  MlpJob whole;
  whole.config = config;
  whole.last_step = 9;
  const auto reference = train_mlp(whole);
  const auto reference_losses = losses(reference);
  for (int at : {2, 5}) {
    dstest::TempDir dir;
    MlpJob first = whole, second = whole;
    first.last_step = first.save_at = at;
    first.save_dir = dir.path();
    second.first_step = at + 1;
    second.load_dir = dir.path();
    train_mlp(first);
    auto resumed = train_mlp(second);
    std::vector<double> tail(reference_losses.begin() + at, reference_losses.end());
    EXPECT_EQ(losses(resumed), tail) << "saved at step " << at;
    EXPECT_EQ(dstest::max_abs_diff(resumed.weights, reference.weights), 0.0)
        << "saved at step " << at;
    EXPECT_EQ(resumed.steps.back().state, reference.steps.back().state) << "saved at step " << at;
  }
}

// Saved in fp16 after the freeze, resumed in fp32 (and the other way): the extra state is laid
// out per parameter, in the model's order, in both (zero/flat_stage.cpp names the segments in
// that order although the flat buffer holds the parameters reversed; the fp16 master's alignment
// padding is left out), so it loads, and the resumed run follows the uninterrupted one within
// fp16's rounding. Measured: 1.1e-4 relative (with the segments in buffer order, each
// parameter's ratios and error feedback went to another: 3.1e-2); asserted 2e-3.
TEST(OneBitLamb16Bit, CheckpointMovesBetweenFp16AndFp32) {
  const json fp16 = mlp_config("OneBitLamb", {{"freeze_step", 3}});
  const json fp32 = mlp_config("OneBitLamb", {{"freeze_step", 3}}, /*fp16=*/false);
  for (bool from_fp16 : {true, false}) {
    MlpJob whole;
    whole.config = from_fp16 ? fp16 : fp32;
    whole.last_step = 9;
    const auto reference = losses(train_mlp(whole));
    dstest::TempDir dir;
    MlpJob first = whole, second = whole;
    first.last_step = first.save_at = 5;
    first.save_dir = dir.path();
    second.config = from_fp16 ? fp32 : fp16;
    second.first_step = 6;
    second.load_dir = dir.path();
    train_mlp(first);
    const auto resumed = train_mlp(second);
    ASSERT_EQ(resumed.steps.size(), 4u);
    double worst = 0;
    for (size_t i = 0; i < 4; ++i)
      worst = std::max(worst, std::abs(resumed.steps[i].loss - reference[5 + i]) / reference[5 + i]);
    std::cout << (from_fp16 ? "fp16 -> fp32" : "fp32 -> fp16")
              << ": largest relative loss difference after resuming " << worst << "\n";
    EXPECT_LT(worst, 2e-3);
    EXPECT_EQ(resumed.steps[0].state[0], 6.0);  // the step count came along
  }
}

// Issue 18's bar on the fp16 net, as optimizer_convergence_test sets it for the GPT in fp32:
// after 200 steps the mean loss of steps 181-200 within 5% of the uncompressed counterpart's
// (Lamb without bias correction, as 1-bit Lamb never corrects). Noisy targets (std 0.3) give the
// loss a floor of 0.09, so the comparison is of trained losses, not of how close to zero each
// gets; 25% warm-up (freeze_step 50), lr 0.02. On this small net one run's gap moves with the
// noise drawn (measured over 5 draws: -4.5% .. +5.5%, mean -0.3%), so the bar is on the mean of
// the first 3 draws (measured: 1-bit Lamb 0.1324, Lamb 0.1328, -0.3%). Adam (lr 0.02, no bias
// correction) is printed, not asserted: 0.1234, Lamb itself ends 7.6% behind it on this net, a
// gap of the trust ratio, not of the compression.
TEST(OneBitLamb16Bit, Fp16TrainsWithinFivePercentOfLambAfter200Steps) {
  double onebit = 0, lamb = 0, adam = 0;
  const int draws = 3;
  for (int d = 0; d < draws; ++d) {
    MlpJob jobs[3];
    jobs[0].config = mlp_config("OneBitLamb", {{"freeze_step", 50}});
    jobs[1].config = mlp_config("Lamb", {{"bias_correction", false}});
    jobs[2].config = mlp_config("Adam", {{"lr", 2e-2}, {"bias_correction", false}});
    double tail[3];
    for (int k = 0; k < 3; ++k) {
      jobs[k].last_step = 200;
      jobs[k].label_noise = 0.3;
      jobs[k].noise_seed = 20000 + 10000 * d;
      const auto run = losses(train_mlp(jobs[k]));
      tail[k] = dstest::tail_mean(run, 20);
      if (k == 0) EXPECT_LT(tail[0], 0.2 * run.front()) << "draw " << d;
    }
    std::cout << "draw " << d << ": mean loss of steps 181-200 in fp16: 1-bit Lamb " << tail[0]
              << ", Lamb " << tail[1] << " (" << (tail[0] - tail[1]) / tail[1] * 100
              << "%), Adam " << tail[2] << "\n";
    onebit += tail[0] / draws;
    lamb += tail[1] / draws;
    adam += tail[2] / draws;
  }
  std::cout << "mean of " << draws << " draws: 1-bit Lamb " << onebit << ", Lamb " << lamb << " ("
            << (onebit - lamb) / lamb * 100 << "%), Adam " << adam << " ("
            << (onebit - adam) / adam * 100 << "%)\n";
  EXPECT_LT(std::abs(onebit - lamb) / lamb, 0.05);
}

TEST(OneBitLamb16Bit, Bf16AndStaticFp16LossScaleRefusedAsDeepSpeed) {
  json bf16 = mlp_config("OneBitLamb", {{"freeze_step", 2}}, false);
  bf16["bf16"] = {{"enabled", true}};
  std::string msg = config_error(bf16);
  EXPECT_NE(msg.find("bf16.enabled"), std::string::npos) << msg;
  EXPECT_NE(msg.find("OneBitLamb"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dynamic loss scaling"), std::string::npos) << msg;
  json fixed = mlp_config("OneBitLamb", {{"freeze_step", 2}});
  fixed["fp16"]["loss_scale"] = 128;
  msg = config_error(fixed);
  EXPECT_NE(msg.find("fp16.loss_scale"), std::string::npos) << msg;
  EXPECT_NE(msg.find("OneBitLamb"), std::string::npos) << msg;
  json stage1 = mlp_config("OneBitLamb", {{"freeze_step", 2}});
  stage1["zero_optimization"]["stage"] = 1;
  msg = config_error(stage1);
  EXPECT_NE(msg.find("zero_optimization.stage"), std::string::npos) << msg;
  EXPECT_EQ(config_error(mlp_config("OneBitLamb", {{"freeze_step", 2}})), "<no ConfigError>");
}

}  // namespace onebit_lamb_16bit_test
