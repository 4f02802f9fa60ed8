// Checkpoints of Lamb and the 1-bit family. Their per-element state is Adam's (step, exp_avg,
// exp_avg_sq: for the 1-bit optimizers the variance is the frozen one), saved as Adam's
// fragments; the 1-bit optimizers' own state (error feedback; 0/1 Adam's local updates between
// syncs; 1-bit Lamb's fresh variance and ratios) is saved beside it (optim/extra_state.h):
//   - Lamb resumes bit-exact, and reshards (saved on 2 ranks at stage 2, loaded on 1 at stage 0);
//   - 1-bit Adam, 0/1 Adam (saved between two syncs, where each rank holds its own parameters
//     and momentum) and 1-bit Lamb resume bit-exact at the same world size;
//   - at another world size the per-rank state restarts (DeepSpeed resets the error feedback on
//     every load) and training goes on: 1-bit Lamb keeps its replicated state.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "optim/adamw_state.h"
#include "support/checkpoint_run.h"
#include "support/files.h"
#include "support/training_run.h"

namespace lamb_onebit_checkpoint_test {

using nlohmann::json;

namespace {

json with_optimizer(int stage, const json& optimizer) {
  json c = dstest::base_config(2, 1, stage);
  c["optimizer"] = optimizer;
  return c;
}

struct Resumed {
  dstest::CheckpointJobResult whole, resumed;
};

// `steps` uninterrupted, against a job saving at `save_at` and one resuming from it.
// `inspect`, when given, sees the checkpoint folder between the save and the resume.
Resumed save_and_resume(const json& save_config, int save_world, const json& load_config,
                        int load_world, int save_at, int steps,
                        const std::function<void(const std::string&)>& inspect = nullptr) {
  dstest::TempDir dir;
  dstest::CheckpointJob whole;
  whole.world_size = load_world;
  whole.config = load_config;
  whole.steps = steps;
  dstest::CheckpointJob first = whole;
  first.world_size = save_world;
  first.config = save_config;
  first.steps = save_at;
  first.save_dir = dir.path();
  first.save_at = {save_at};
  dstest::CheckpointJob second = whole;
  second.model_seed = 99;  // loading must win
  second.load_dir = dir.path();
  Resumed r;
  r.whole = dstest::run_checkpoint_job(whole);
  dstest::run_checkpoint_job(first);
  if (inspect) inspect(dir.path());
  r.resumed = dstest::run_checkpoint_job(second);
  return r;
}

// Loads `dir` into one engine of `config` on one rank (built from another seed: loading must
// win) and compares, before any step, its live weights and its optimizer's exp_avg / exp_avg_sq
// with the saved ones read from the files (consolidated across the saving ranks), bit for bit.
void expect_loaded_state_is_the_saved_one(const json& config, const std::string& dir,
                                          const std::string& name) {
  const dstest::ConsolidatedState saved = dstest::consolidated_state(dir);
  ASSERT_FALSE(saved.exp_avg.empty()) << name;
  auto e = dstest::make_single_engine(config, {256, 16, 2, 2, 32}, /*seed=*/99);
  e.engine->load_checkpoint(dir);
  auto params = e.model->named_parameters();
  auto& opt = *e.engine->optimizer();
  auto check = [&](const std::vector<std::pair<std::string, torch::Tensor>>& want,
                   const std::string& kind) {
    for (const auto& [pname, t] : want) {
      const torch::Tensor* p = params.find(pname);
      if (p == nullptr) {
        ADD_FAILURE() << name << ": no parameter " << pname;
        continue;
      }
      torch::Tensor got;
      if (kind == "fp32") {
        got = p->detach();
      } else {
        auto it = opt.state().find(deepspeed::compat::optimizer_state_key(*p));
        if (it == opt.state().end()) {
          ADD_FAILURE() << name << ": " << pname << " has no optimizer state after the load";
          continue;
        }
        const auto& st = static_cast<const torch::optim::AdamWParamState&>(*it->second);
        got = kind == "exp_avg" ? st.exp_avg() : st.exp_avg_sq();
      }
      EXPECT_TRUE(got.to(torch::kFloat).equal(t.to(torch::kFloat).view(got.sizes())))
          << name << ": " << kind << " of " << pname << " differs from the saved one by "
          << (got.to(torch::kDouble) - t.to(torch::kDouble).view(got.sizes())).abs().max().item<double>();
    }
  };
  check(saved.fp32, "fp32");
  check(saved.exp_avg, "exp_avg");
  check(saved.exp_avg_sq, "exp_avg_sq");
}

const json kLamb = {{"type", "Lamb"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.01}}}};

}  // namespace

TEST(LambCheckpoint, ResumesBitExact) {
  auto c = with_optimizer(2, kLamb);
  auto r = save_and_resume(c, 2, c, 2, 4, 8);
  ASSERT_EQ(r.resumed.start_step, 4);
  std::vector<double> tail(r.whole.losses.begin() + 4, r.whole.losses.end());
  EXPECT_EQ(r.resumed.losses, tail);
  EXPECT_EQ(dstest::max_abs_diff(r.resumed.weights, r.whole.weights), 0.0);
}

TEST(LambCheckpoint, ReshardsFromTwoRanksStageTwoToOneRankStageZero) {
  auto saved = with_optimizer(2, kLamb), loaded = with_optimizer(0, kLamb);
  loaded["train_micro_batch_size_per_gpu"] = 4;  // the same global batch on one rank
  auto r = save_and_resume(saved, 2, loaded, 1, 4, 8);
  // The uninterrupted reference runs on 1 rank: same global batches, summation order differs.
  std::vector<double> tail(r.whole.losses.begin() + 4, r.whole.losses.end());
  EXPECT_LT(dstest::max_rel_diff(r.resumed.losses, tail), dstest::kLossTol);
  EXPECT_LT(dstest::max_abs_diff(r.resumed.weights, r.whole.weights), dstest::kWeightTol);
}

struct OneBitCase {
  std::string name;
  json optimizer;
  int save_at, steps;
  int reshard_save_at;  // where to save for a load at another world size
};

// The 1-bit Adams run with eps 1e-4: at the default 1e-8 this small model diverges a few steps
// after so short a warm-up. The compressed exchange gives every element the tensor's scale, and
// token embedding rows of bytes the warm-up did not see keep a frozen variance of exactly 0, so
// each compressed step moved them by ~lr·scale/1e-8 (max |w| 600 to 1.5e5 by step 12 in fp32,
// mostly NaN in bf16), and every later loss followed the rounding (a BLAS, a thread count, a 1e-6
// nudge of the initial weights). eps 1e-4 caps those steps at a few lr: max |w| stays below 2.1
// in fp32 and bf16 over 12 (1-bit Adam) and 14 (0/1 Adam) steps across those perturbations,
// model seeds and data orders.
const std::vector<OneBitCase>& one_bit_cases() {
  static const std::vector<OneBitCase> cases = {
      {"OneBitAdam",
       {{"type", "OneBitAdam"}, {"params", {{"lr", 3e-3}, {"eps", 1e-4}, {"freeze_step", 3}}}},
       8, 12, 8},
      // var_freeze_step 4, scalers 2/2, clipper 4: syncs at steps 8, 12, 16 (zero_one_adam_test);
      // saved at step 10, between two syncs, where each rank holds its own parameters and
      // momentum and its local updates wait for step 12.
      {"ZeroOneAdam",
       {{"type", "ZeroOneAdam"},
        {"params", {{"lr", 1e-3}, {"eps", 1e-4}, {"var_freeze_step", 4}, {"var_update_scaler", 2},
                    {"local_step_scaler", 2}, {"local_step_clipper", 4}}}},
       10, 14, 8},  // resharded from a sync: the local updates since one are per rank
      {"OneBitLamb",
       {{"type", "OneBitLamb"}, {"params", {{"lr", 0.03}, {"weight_decay", 0.01}, {"freeze_step", 3}}}},
       8, 12, 8},
  };
  return cases;
}

class OneBitCheckpoint : public ::testing::TestWithParam<size_t> {};

TEST_P(OneBitCheckpoint, ResumesBitExactAtTheSameWorldSize) {
  const OneBitCase& c = one_bit_cases()[GetParam()];
  auto config = with_optimizer(0, c.optimizer);
  auto r = save_and_resume(config, 2, config, 2, c.save_at, c.steps);
  ASSERT_EQ(r.resumed.start_step, c.save_at);
  std::vector<double> tail(r.whole.losses.begin() + c.save_at, r.whole.losses.end());
  EXPECT_EQ(r.resumed.losses, tail) << c.name;
  EXPECT_EQ(dstest::max_abs_diff(r.resumed.weights, r.whole.weights), 0.0) << c.name;
}

// Saved on 2 ranks, resumed on 1 with the same global batch: the per-rank state is not handed
// over (there is no rank to take it from), training goes on from the loaded weights and moments.
//   - The weights carry over exactly: the first resumed loss (before any step) is the 2-rank
//     run's loss at that step.
//   - The moments carry over: right after the load, before any step, the one-rank engine's
//     exp_avg and exp_avg_sq (and weights) are the saved ones bit for bit (a momentum or variance
//     reset or left behind on the way shows here; the per-rank state that restarts is the error
//     feedback and local updates beside them). And the next 3 steps stay below the untrained
//     loss: a variance lost on the way (zeros under a frozen variance) steps by m/eps and the
//     loss leaves that bound at once.
// Not asserted: how close the resumed losses stay to the 2-rank run's. On 1 rank the compression
// is a no-op, on 2 it is the 1-bit one, so the runs part by the compression error: their 4-step
// means differ by 0.3% (0/1 Adam) to 3% (1-bit Adam), the same to 3 digits with 2 threads or the
// reference BLAS. (At eps 1e-8, see one_bit_cases, they differed by 1-4% with OpenBLAS and 7-15%
// with MKL, a BLAS alone moved the 2-rank mean by 5%, and from about step 13 every run of the
// 1-bit Adams went above the untrained loss; with eps 1e-4 they stay below it through step 30.)
TEST_P(OneBitCheckpoint, AtAnotherWorldSizeThePerRankStateRestarts) {
  const OneBitCase& c = one_bit_cases()[GetParam()];
  auto saved = with_optimizer(0, c.optimizer), loaded = saved;
  loaded["train_micro_batch_size_per_gpu"] = 4;
  const int at = c.reshard_save_at, steps = at + 4;
  auto two_ranks = save_and_resume(saved, 2, saved, 2, at, steps);
  auto r = save_and_resume(saved, 2, loaded, 1, at, steps, [&](const std::string& dir) {
    expect_loaded_state_is_the_saved_one(loaded, dir, c.name);
  });
  ASSERT_EQ(r.resumed.losses.size(), static_cast<size_t>(steps - at));
  std::vector<double> tail(two_ranks.whole.losses.begin() + at, two_ranks.whole.losses.end());
  std::cout << c.name << ": mean loss after resuming on 1 rank "
            << dstest::tail_mean(r.resumed.losses, tail.size()) << ", on 2 ranks "
            << dstest::tail_mean(tail, tail.size()) << "\n";
  EXPECT_LT(std::abs(r.resumed.losses[0] - tail[0]) / tail[0], dstest::kLossTol) << c.name;
  const double untrained = two_ranks.whole.losses.front();
  for (size_t i = 1; i < r.resumed.losses.size(); ++i) {
    EXPECT_TRUE(std::isfinite(r.resumed.losses[i])) << c.name << " step " << at + i;
    EXPECT_LT(r.resumed.losses[i], untrained) << c.name << " step " << at + i;
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, OneBitCheckpoint, ::testing::Values(0, 1, 2),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return one_bit_cases()[info.param].name;
                         });

// In bf16 the 1-bit Adams step stage 0's flat fp32 master (zero/flat_stage.h) and compress it per
// parameter segment: 1-bit Adam saved after its freeze and 0/1 Adam saved at a sync or between
// two syncs (each rank's own masters, restored with the extra state and written into the 16-bit
// weights after it) resume bit for bit as well (masters, moments, error feedback).
// 1-bit Adam is saved five compressed steps after its freeze (error feedback in place) and run four
// more. At eps 1e-8 (see one_bit_cases) bf16 runs of both reached NaN within these steps, with
// OpenBLAS after a 1e-6 nudge of the initial weights, with MKL as they were; the test had saved
// 1-bit Adam at step 5 of 7 to stay ahead of it, and 0/1 Adam failed with MKL all the same.
TEST(OneBitCheckpoint16Bit, Bf16ResumesBitExactAtTheSameWorldSize) {
  struct Bf16Case {
    size_t one_bit_case;
    std::vector<int> save_at;
    int steps;
  };
  for (const Bf16Case& b : {Bf16Case{0, {8}, 12}, Bf16Case{1, {8, 10}, 14}}) {
    const OneBitCase& c = one_bit_cases()[b.one_bit_case];
    auto config = with_optimizer(0, c.optimizer);
    config["bf16"] = {{"enabled", true}};
    for (int at : b.save_at) {
      auto r = save_and_resume(config, 2, config, 2, at, b.steps);
      ASSERT_EQ(r.resumed.start_step, at) << c.name;
      for (double loss : r.whole.losses) ASSERT_TRUE(std::isfinite(loss)) << c.name;
      std::vector<double> tail(r.whole.losses.begin() + at, r.whole.losses.end());
      EXPECT_EQ(r.resumed.losses, tail) << c.name << " saved at step " << at;
      EXPECT_EQ(dstest::max_abs_diff(r.resumed.weights, r.whole.weights), 0.0)
          << c.name << " saved at step " << at;
    }
  }
}

// 0/1 Adam saved between two syncs (step 10 of the ZeroOneAdam case: each rank holds its own
// parameters, momentum and local updates) in bf16 and resumed in fp32 on as many ranks, and the
// other way. Its per-rank state is laid out per parameter in the model's order in both precisions
// (the 16-bit master holds the parameters reversed and padded: saved as that buffer, the fp32
// load threw or scrambled every rank's weights), so the load succeeds and the first resumed loss,
// computed before any step from the loaded weights, is the saving run's at that step within
// bf16's rounding of the forward. Measured: 2.6e-5 relative bf16 -> fp32, 4.7e-5 fp32 -> bf16
// (1.3e-4 with the reference BLAS; at eps 1e-8, 4.4e-3 and 3.2e-4, and the second resumed loss
// NaN with the reference BLAS); asserted 2e-2 (bf16 keeps 8 significant bits, 3.9e-3). Saved as
// the master's buffer, the first resumed loss was 3e18 times the expected one (bf16 -> fp32) and
// 35 times (fp32 -> bf16), at eps 1e-8.
TEST(OneBitCheckpoint16Bit, ZeroOneAdamMovesBetweenBf16AndFp32BetweenTwoSyncs) {
  const OneBitCase& c = one_bit_cases()[1];
  ASSERT_EQ(c.name, "ZeroOneAdam");
  const json fp32 = with_optimizer(0, c.optimizer);
  json bf16 = fp32;
  bf16["bf16"] = {{"enabled", true}};
  for (bool from_bf16 : {true, false}) {
    SCOPED_TRACE(from_bf16 ? "bf16 -> fp32" : "fp32 -> bf16");
    dstest::TempDir dir;
    dstest::CheckpointJob whole;
    whole.world_size = 2;
    whole.config = from_bf16 ? bf16 : fp32;
    whole.steps = c.save_at + 2;
    dstest::CheckpointJob first = whole, second = whole;
    first.steps = c.save_at;
    first.save_dir = dir.path();
    first.save_at = {c.save_at};
    second.config = from_bf16 ? fp32 : bf16;
    second.model_seed = 99;  // loading must win
    second.load_dir = dir.path();
    const auto reference = dstest::run_checkpoint_job(whole);
    dstest::run_checkpoint_job(first);
    const auto resumed = dstest::run_checkpoint_job(second);
    ASSERT_EQ(resumed.start_step, c.save_at);
    ASSERT_EQ(resumed.losses.size(), 2u);
    const double expected = reference.losses[c.save_at];
    const double rel = std::abs(resumed.losses[0] - expected) / expected;
    std::cout << (from_bf16 ? "bf16 -> fp32" : "fp32 -> bf16") << ": first resumed loss "
              << resumed.losses[0] << ", uninterrupted " << expected << " (relative " << rel
              << ")\n";
    EXPECT_LT(rel, 2e-2);
    EXPECT_TRUE(std::isfinite(resumed.losses[1]));
  }
}

}  // namespace lamb_onebit_checkpoint_test
