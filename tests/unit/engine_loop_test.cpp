// The training loop's bookkeeping as DeepSpeed users rely on it: was_step_applied between
// accumulation boundaries, where the first boundary falls after a resume with another
// accumulation, the loader's last partial micro-batch (dataloader_drop_last), and the 1/GAS
// scaling of a 16-bit loss.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>

#include "runtime/engine_state.h"
#include "support/checkpoint_run.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/training_run.h"

namespace engine_loop_test {

using dstest::make_single_engine;

namespace {

const gpt::GPTConfig kModel{256, 8, 1, 2, 16};

// One forward, backward and step on the engine's own loader.
void micro_step(dstest::SingleEngine& e) {
  auto batch = e.loader->next();
  e.engine->backward(e.engine->forward(batch.data, batch.target));
  e.engine->step();
}

// `n` micro-steps on the engine's loader; the batches they took.
std::vector<deepspeed::Batch> micro_steps(dstest::SingleEngine& e, int n) {
  std::vector<deepspeed::Batch> batches;
  for (int i = 0; i < n; ++i) {
    batches.push_back(e.loader->next());
    e.engine->backward(e.engine->forward(batches.back().data, batches.back().target));
    e.engine->step();
  }
  return batches;
}

}  // namespace

// DeepSpeed's step() assumes "not applied" until a boundary applies it; before, the previous
// boundary's true stayed until the next boundary.
TEST(EngineLoop, WasStepAppliedIsFalseBetweenBoundaries) {
  auto e = make_single_engine(dstest::base_config(2, 2, 1), kModel);
  for (int i = 1; i <= 4; ++i) {
    micro_step(e);
    EXPECT_EQ(e.engine->was_step_applied(), i % 2 == 0) << "micro-step " << i;
  }
}

// Saved after 3 steps of 2 micro-batches, resumed with 4 micro-batches per step (the same batch
// on fewer ranks): the first resumed step takes 4 micro-batches. Before, the saved micro-step
// count (6) put the first boundary after 2.
TEST(EngineLoop, AResumeWithAnotherAccumulationStartsAtAWholeStep) {
  dstest::TempDir dir;
  auto saved = make_single_engine(dstest::base_config(2, 2, 1), kModel);
  saved.train(3);
  saved.engine->save_checkpoint(dir.path());
  auto resumed = make_single_engine(dstest::base_config(1, 4, 1), kModel);
  resumed.engine->load_checkpoint(dir.path());
  ASSERT_EQ(resumed.engine->global_steps(), 3);
  int micro_batches = 0;
  while (resumed.engine->global_steps() == 3) {
    micro_step(resumed);
    ++micro_batches;
  }
  EXPECT_EQ(micro_batches, 4);
}

// Saved after 6 micro-batches of an accumulation of 4 (step 1 plus half of step 2), resumed: the
// resumed job trains micro-batches 4-7 as its step 2 (the two already seen are not in the
// checkpoint, so it sees them again) and its weights after step 3 are the uninterrupted run's.
// Before, the loader resumed at batch 6: batches 4-5 were never trained and every later step
// took [4k+2, 4k+6).
TEST(EngineLoop, ASaveBetweenBoundariesResumesAtTheStepsFirstMicroBatch) {
  dstest::TempDir dir;
  const auto config = dstest::base_config(2, 4, 1);
  auto straight = make_single_engine(config, kModel);
  straight.train(3);
  auto saved = make_single_engine(config, kModel);
  for (int i = 0; i < 6; ++i) micro_step(saved);
  ASSERT_EQ(saved.engine->global_steps(), 1);
  saved.engine->save_checkpoint(dir.path());
  auto resumed = make_single_engine(config, kModel, /*seed=*/8);  // other initial weights
  resumed.engine->load_checkpoint(dir.path());
  EXPECT_EQ(resumed.loader->state().batch_in_epoch, 4);
  while (resumed.engine->global_steps() < 3) micro_step(resumed);
  const auto want = straight.weights(), got = resumed.weights();
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(torch::equal(want[i], got[i])) << "weight " << i;
}

// The norm of a bf16 model's gradients summed over `batches` as `accumulate` sums them: each
// micro-step's bf16 gradient (of loss / GAS, in fp32 as the engine divides it) added into an
// fp32 sum, or into a bf16 one. With `all_reduced` the sum is then rounded to bf16, as stages
// 0/1 send it at the boundary in bf16 (communication_data_type's default; DeepSpeed rounds it so
// too, at any world size); stages 2/3 reduce each micro-step's bf16 gradient before adding it.
double reference_norm(const std::vector<deepspeed::Batch>& batches, at::ScalarType accumulate,
                      bool all_reduced = true) {
  torch::manual_seed(7);  // make_single_engine's seed: the engine's initial weights
  auto model = std::make_shared<gpt::GPTImpl>(kModel);
  model->to(at::kBFloat16);
  std::vector<at::Tensor> sums;
  for (auto& p : model->parameters()) sums.push_back(torch::zeros_like(p, accumulate));
  for (const auto& batch : batches) {
    at::Tensor loss = model->forward(batch.data, batch.target);
    (loss.to(at::kFloat) / static_cast<double>(batches.size())).backward();
    auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      sums[i].add_(params[i].grad());
      params[i].mutable_grad() = at::Tensor();
    }
  }
  double sq = 0;
  for (auto& g : sums)
    sq += (all_reduced ? g.to(at::kBFloat16) : g).to(at::kDouble).pow(2).sum().item<double>();
  return std::sqrt(sq);
}

// bf16 without ZeRO accumulates its micro-steps in fp32, as DeepSpeed's BF16_Optimizer (its
// default grad_accum_dtype there); data_types.grad_accum_dtype = "bf16" keeps them in bf16.
// Before, stages 0/1 always summed in the parameters' dtype, whatever the key said.
TEST(EngineLoop, Bf16WithoutZeroAccumulatesInFp32) {
  for (std::string dtype : {"", "bf16"}) {
    auto config = dstest::base_config(2, 4, 0);
    config["bf16"] = {{"enabled", true}};
    if (!dtype.empty()) config["data_types"] = {{"grad_accum_dtype", dtype}};
    auto e = make_single_engine(config, kModel);
    const auto batches = micro_steps(e, 4);
    const double fp32_sum = reference_norm(batches, at::kFloat);
    const double bf16_sum = reference_norm(batches, at::kBFloat16);
    ASSERT_GT(std::abs(fp32_sum - bf16_sum), 1e-6 * fp32_sum) << "the test cannot tell them apart";
    const double want = dtype.empty() ? fp32_sum : bf16_sum;
    EXPECT_NEAR(e.engine->get_global_grad_norm(), want, 1e-9 * want) << "grad_accum_dtype '" << dtype << "'";
  }
}

// The same key at stages 1 and 3 (DeepSpeed: fp32 at stage 1 selects its BF16_Optimizer; stage 3
// allocates its gradient partition in it). Before, both summed in bf16.
TEST(EngineLoop, GradAccumDtypeIsTakenAtStagesOneAndThree) {
  for (int stage : {1, 3}) {
    auto config = dstest::base_config(2, 4, stage);
    config["bf16"] = {{"enabled", true}};
    config["data_types"] = {{"grad_accum_dtype", "fp32"}};
    auto e = make_single_engine(config, kModel);
    const auto batches = micro_steps(e, 4);
    const double want = reference_norm(batches, at::kFloat, /*all_reduced=*/stage == 1);
    EXPECT_NEAR(e.engine->get_global_grad_norm(), want, 1e-9 * want) << "stage " << stage;
  }
}

// DeepSpeed's default keeps the last, partial micro-batch of an epoch (its DataLoader's
// drop_last is dataloader_drop_last, false unless given). Before, it was always dropped.
TEST(EngineLoop, DataloaderDropLastDecidesTheLastPartialMicroBatch) {
  auto keep = make_single_engine(dstest::base_config(3, 1, 0), kModel);
  const int64_t samples = dstest::test_text_dataset(kModel.block_size)->size();
  ASSERT_NE(samples % 3, 0) << "the test needs a partial last micro-batch";
  EXPECT_EQ(keep.loader->batches_per_epoch(), (samples + 2) / 3);
  auto config = dstest::base_config(3, 1, 0);
  config["dataloader_drop_last"] = true;
  auto drop = make_single_engine(config, kModel);
  EXPECT_EQ(drop.loader->batches_per_epoch(), samples / 3);
}

// The same error from initialize() names the config keys (the loader's constructor arguments
// are not what a user sets). Before, it named neither key.
TEST(EngineLoop, AnEpochOfNoMicroBatchNamesTheConfigKeys) {
  const int64_t samples = dstest::test_text_dataset(kModel.block_size)->size();
  auto config = dstest::base_config(static_cast<int>(samples) + 1, 1, 0);
  config["dataloader_drop_last"] = true;
  const std::string msg =
      dstest::message_of<deepspeed::ConfigError>([&] { make_single_engine(config, kModel); });
  EXPECT_CONTAINS(msg, "train_micro_batch_size_per_gpu");
  EXPECT_CONTAINS(msg, "dataloader_drop_last");
}

// A bf16 loss is divided by the accumulation in fp32 (DeepSpeed: loss.float()): bf16(1/3) is
// 0.2% off, in every gradient of the step.
TEST(EngineLoop, AccumulationScalesA16BitLossInFp32) {
  auto config = dstest::base_config(2, 3, 0);
  config["bf16"] = {{"enabled", true}};
  auto e = make_single_engine(config, kModel);
  auto batch = e.loader->next();
  at::Tensor loss = e.engine->forward(batch.data, batch.target).to(at::kBFloat16);
  at::Tensor scaled = e.engine->backward(loss);
  EXPECT_EQ(scaled.scalar_type(), at::kFloat);
  EXPECT_EQ(scaled.item<float>(), loss.item<float>() / 3.0f);
}

// The pipeline's last stage divides its loss the same way (the shared helper).
TEST(EngineLoop, TheAccumulationDividesA16BitLossInFp32) {
  const at::Tensor loss = torch::full({}, 2.0, at::kBFloat16);
  const at::Tensor scaled = deepspeed::divided_by_accumulation(loss, 3);
  EXPECT_EQ(scaled.scalar_type(), at::kFloat);
  EXPECT_EQ(scaled.item<float>(), 2.0f / 3.0f);
  EXPECT_TRUE(deepspeed::divided_by_accumulation(loss, 1).is_same(loss));
}

// A schedule that cannot take the next step (WarmupCosineLR whose total equals its warm-up) is
// refused before the update: the weights and counters are as before the call. Before, the update
// was applied and the scheduler threw after it.
TEST(EngineLoop, AStepTheScheduleCannotTakeIsRefusedBeforeTheUpdate) {
  auto config = dstest::base_config(2, 1, 1);
  config["scheduler"] = {{"type", "WarmupCosineLR"},
                         {"params", {{"total_num_steps", 2}, {"warmup_num_steps", 2}}}};
  auto e = make_single_engine(config, kModel);
  micro_step(e);
  micro_step(e);
  const auto before = e.weights();
  auto batch = e.loader->next();
  e.engine->backward(e.engine->forward(batch.data, batch.target));
  EXPECT_THROW(e.engine->step(), deepspeed::ConfigError);
  EXPECT_EQ(e.engine->global_steps(), 2);
  EXPECT_TRUE(dstest::bit_identical(e.weights(), before));
}

// A grad_accum_dtype narrower than an fp32 model's parameters is refused at initialize(), naming
// the key, at every stage (before, stage 2 failed inside the first step's fused Adam, and the
// other stages ignored it).
TEST(EngineLoop, AGradAccumDtypeNarrowerThanTheModelIsRefused) {
  for (int stage : {0, 1, 2, 3}) {
    auto config = dstest::base_config(2, 4, stage);
    config["data_types"] = {{"grad_accum_dtype", "bf16"}};
    const std::string message = dstest::message_of<deepspeed::ConfigError>(
        [&] { make_single_engine(config, kModel); });
    EXPECT_CONTAINS(message, "data_types.grad_accum_dtype") << "stage " << stage;
  }
}

}  // namespace engine_loop_test
