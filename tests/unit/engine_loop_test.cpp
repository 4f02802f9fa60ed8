// The training loop's bookkeeping as DeepSpeed users rely on it: was_step_applied between
// accumulation boundaries, where the first boundary falls after a resume with another
// accumulation, the loader's last partial micro-batch (dataloader_drop_last), and the 1/GAS
// scaling of a 16-bit loss.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "runtime/engine_state.h"
#include "support/checkpoint_run.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/training_run.h"

using dstest::make_single_engine;

namespace {

const gpt::GPTConfig kModel{256, 8, 1, 2, 16};

// One forward, backward and step on the engine's own loader.
void micro_step(dstest::SingleEngine& e) {
  auto batch = e.loader->next();
  e.engine->backward(e.engine->forward(batch.data, batch.target));
  e.engine->step();
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
