// bf16.check_grad_overflow (precision/overflow_vote.h), 2 ranks as threads at ZeRO stages 0-3
// and a 2-stage x 2-data pipeline: an inf in ONE rank's gradients
//  - with the key true skips the step on every rank (weights, fp32 masters and moments
//    bit-identical, skipped_steps 1, global_steps still counted, the LR schedule not stepped,
//    one OVERFLOW line for the job), and the next clean step trains;
//  - with the key absent (default false) is applied, as in DeepSpeed: the masters become
//    non-finite and nothing is skipped.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "deepspeed/engine.h"
#include "deepspeed/pipe.h"
#include "support/expect.h"
#include "support/half_mlp.h"
#include "support/pipeline_gpt.h"
#include "support/rank_snapshot.h"
#include "support/ranks.h"
#include "support/training_run.h"

namespace bf16_overflow_test {

namespace {

using dstest::all_finite;
using dstest::bit_identical;
using dstest::HalfMlp;
using dstest::HalfMlpImpl;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr const char* kSkipLine = "bf16.check_grad_overflow found inf/NaN gradients";

// bf16 with a linear warm-up, so a stepped schedule shows in get_lr(). `check` unset: the key is
// not written (its default).
nlohmann::json bf16_config(nlohmann::json base, std::optional<bool> check) {
  base["optimizer"]["params"]["lr"] = 1e-2;
  base["bf16"] = {{"enabled", true}};
  if (check) base["bf16"]["check_grad_overflow"] = *check;
  base["scheduler"] = {{"type", "WarmupLR"},
                       {"params", {{"warmup_num_steps", 10}, {"warmup_type", "linear"}}}};
  return base;
}

// 3 clean steps, then step 3 with rank 1's loss multiplied by inf (its gradients inf/NaN, rank
// 0's finite), then a clean step 4. `check` as in bf16_config. Returns what rank 0 printed.
std::string poison_one_rank(int stage, std::optional<bool> check) {
  testing::internal::CaptureStdout();
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    torch::manual_seed(5);
    auto model = HalfMlp();
    auto [engine, opt, loader, sched] = deepspeed::initialize<HalfMlpImpl>(
        {.model = model.ptr(),
         .config_json = bf16_config(dstest::base_config(8, 1, stage), check),
         .comm = comm});
    for (auto& p : model->parameters()) ASSERT_EQ(p.scalar_type(), torch::kBFloat16);
    auto train_step = [&](int64_t step, bool poison) {
      auto b = dstest::half_mlp_batch(comm->rank(), step);
      auto loss = engine->forward(b.x, b.y);
      if (poison) loss = loss * kInf;
      engine->backward(loss);
      engine->step();
    };
    for (int64_t step = 0; step < 3; ++step) train_step(step, false);
    ASSERT_TRUE(engine->was_step_applied());
    const auto lr = engine->get_lr();
    const auto before = dstest::snapshot(*engine);
    ASSERT_TRUE(all_finite(before.masters));

    train_step(3, /*poison=*/comm->rank() == 1);
    const auto after = dstest::snapshot(*engine);
    const std::string where = "stage " + std::to_string(stage) + ", rank " +
                              std::to_string(comm->rank());
    EXPECT_EQ(engine->global_steps(), 4) << where;
    if (check.value_or(false)) {
      EXPECT_FALSE(engine->was_step_applied()) << where;
      EXPECT_EQ(engine->skipped_steps(), 1) << where;
      EXPECT_EQ(engine->get_lr(), lr) << where << ": the schedule stepped";
      EXPECT_TRUE(bit_identical(before.weights, after.weights)) << where;
      EXPECT_TRUE(bit_identical(before.masters, after.masters)) << where;
      EXPECT_TRUE(bit_identical(before.moments, after.moments)) << where;

      train_step(4, false);  // the gradients were dropped: the next clean step trains
      EXPECT_TRUE(engine->was_step_applied()) << where;
      EXPECT_EQ(engine->skipped_steps(), 1) << where;
      EXPECT_NE(engine->get_lr(), lr) << where;
      const auto next = dstest::snapshot(*engine);
      EXPECT_FALSE(bit_identical(before.masters, next.masters)) << where;
      EXPECT_TRUE(all_finite(next.masters)) << where;
    } else {
      // Applied as DeepSpeed applies it without the check: the update takes the inf/NaN in.
      EXPECT_TRUE(engine->was_step_applied()) << where;
      EXPECT_EQ(engine->skipped_steps(), 0) << where;
      EXPECT_NE(engine->get_lr(), lr) << where;
      EXPECT_FALSE(all_finite(after.masters)) << where;
    }
  });
  return testing::internal::GetCapturedStdout();
}

}  // namespace

class Bf16CheckGradOverflow : public ::testing::TestWithParam<int> {};

TEST_P(Bf16CheckGradOverflow, InfOnOneRankSkipsTheStepOnEveryRank) {
  const std::string printed = poison_one_rank(GetParam(), true);
  EXPECT_EQ(dstest::occurrences(printed, kSkipLine), 1u) << printed;  // world rank 0 only
  EXPECT_CONTAINS(printed, "[deepspeed] OVERFLOW! Rank 0 Skipping step");
}

// The key is what decides: without it the same step is applied (and nothing is printed).
TEST_P(Bf16CheckGradOverflow, WithoutTheKeyTheStepIsApplied) {
  const std::string printed = poison_one_rank(GetParam(), std::nullopt);
  EXPECT_EQ(dstest::occurrences(printed, "OVERFLOW!"), 0u) << printed;
  poison_one_rank(GetParam(), false);
}

INSTANTIATE_TEST_SUITE_P(Stages, Bf16CheckGradOverflow, ::testing::Values(0, 1, 2, 3));

// ---- pipeline ----------------------------------------------------------------------------------

namespace {

// A linear layer computing in fp32 whatever its parameters' dtype (the engine makes them bf16).
struct Fp32LinearImpl : torch::nn::Module {
  Fp32LinearImpl() {
    w = register_parameter("w", torch::randn({16, 16}) * 0.25);
    b = register_parameter("b", torch::zeros({16}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::tanh(x.to(torch::kFloat).matmul(w.to(torch::kFloat).t()) + b.to(torch::kFloat));
  }
  torch::Tensor w, b;
};
TORCH_MODULE(Fp32Linear);

deepspeed::pipe::PipelineModule linear_pipeline() {
  deepspeed::pipe::PipelineModule m;
  for (int i = 0; i < 4; ++i)
    m.layers.emplace_back("linear", [] { return torch::nn::AnyModule(Fp32Linear()); });
  m.loss_fn = [](const at::Tensor& out, const at::Tensor& y) { return (out - y).pow(2).mean(); };
  return m;
}

deepspeed::pipe::MicroBatch regression_batch(int step, int g) {
  auto x = torch::randn({4, 16}, at::make_generator<at::CPUGeneratorImpl>(1000 * step + g + 1));
  return {x, torch::tanh(x * 0.5)};
}

struct PipeOutcome {
  bool applied = true;
  int64_t skipped = -1, global_steps = -1;
  bool weights_unchanged = false, weights_finite = false, lr_unchanged = false;
  bool next_applied = false;
};

// 2 stages x 2 data ranks at ZeRO stage 1: 2 clean batches, then a batch whose labels are inf on
// data rank 1 (the last stage's loss there is inf; its gradients and those it sends back are
// inf/NaN), then a clean batch.
std::vector<PipeOutcome> poison_one_data_rank(std::optional<bool> check) {
  constexpr int kWorld = 4, kStages = 2, kData = 2;
  std::vector<PipeOutcome> out(kWorld);
  run_ranks(kWorld, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto args = dstest::pipeline_args(comm, kStages, /*zero_stage=*/1, linear_pipeline());
    args.config_json = bf16_config(args.config_json, check);
    args.config_json["train_micro_batch_size_per_gpu"] = 4;
    auto engine = deepspeed::pipe::initialize_pipeline(args);
    const int data_rank = comm->rank() % kData;  // data innermost (comm::Grid)
    auto batch = [&](int k, bool poison) {
      int m = 0;
      engine->train_batch([&] {
        auto mb = regression_batch(k, (m++) * kData + data_rank);
        if (poison) mb.second = torch::full_like(mb.second, kInf);
        return mb;
      });
    };
    batch(0, false);
    batch(1, false);
    const auto lr = engine->get_lr();
    const auto before = dstest::clones(engine->module().parameters());

    batch(2, /*poison=*/data_rank == 1);
    PipeOutcome& o = out[comm->rank()];
    o.applied = engine->was_step_applied();
    o.skipped = engine->skipped_steps();
    o.global_steps = engine->global_steps();
    o.lr_unchanged = engine->get_lr() == lr;
    const auto after = dstest::clones(engine->module().parameters());
    o.weights_unchanged = bit_identical(before, after);
    o.weights_finite = all_finite(after);
    batch(3, false);
    o.next_applied = engine->was_step_applied();
  });
  return out;
}

}  // namespace

// PipeStage sums the norm over the stages: an inf in one data rank's last stage skips the step
// on all four ranks.
TEST(Bf16CheckGradOverflowPipeline, InfOnOneDataRankSkipsTheStepOnEveryStage) {
  const auto runs = poison_one_data_rank(true);
  for (size_t rank = 0; rank < runs.size(); ++rank) {
    const PipeOutcome& o = runs[rank];
    EXPECT_FALSE(o.applied) << "rank " << rank;
    EXPECT_EQ(o.skipped, 1) << "rank " << rank;
    EXPECT_EQ(o.global_steps, 3) << "rank " << rank;
    EXPECT_TRUE(o.lr_unchanged) << "rank " << rank;
    EXPECT_TRUE(o.weights_unchanged) << "rank " << rank;
    EXPECT_TRUE(o.next_applied) << "rank " << rank;
  }
}

TEST(Bf16CheckGradOverflowPipeline, WithoutTheKeyTheStepIsApplied) {
  const auto runs = poison_one_data_rank(std::nullopt);
  for (size_t rank = 0; rank < runs.size(); ++rank) {
    const PipeOutcome& o = runs[rank];
    EXPECT_TRUE(o.applied) << "rank " << rank;
    EXPECT_EQ(o.skipped, 0) << "rank " << rank;
    EXPECT_FALSE(o.lr_unchanged) << "rank " << rank;
    EXPECT_FALSE(o.weights_finite) << "rank " << rank;
  }
}

}  // namespace bf16_overflow_test
