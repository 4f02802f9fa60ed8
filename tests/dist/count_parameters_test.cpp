// deepspeed::count_parameters: a model's full parameter count, each parameter once, at stage 0 and
// at stage 3, where a unit's parameters hold no elements while released (built under zero::Init
// as gpt_train --zero_init does, or partitioned by initialize()).
#include <gtest/gtest.h>

#include "deepspeed/zero_init.h"
#include "deepspeed/zero_unit.h"
#include "support/ranks.h"
#include "support/stage3_models.h"
#include "support/training_run.h"

namespace count_parameters_test {

namespace {
const gpt::GPTConfig kModel{256, 16, 2, 2, 32};

// What model->parameters() adds up to: a released parameter counts 0, a tied one twice.
int64_t naive_count(const torch::nn::Module& model) {
  int64_t n = 0;
  for (auto& p : model.parameters()) n += p.numel();
  return n;
}

nlohmann::json stage3_config() {
  auto c = dstest::base_config(2, 1, 3);
  // Every unit parameter is released (none kept whole as persistent).
  c["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
  return c;
}
}  // namespace

TEST(CountParameters, WholeModelAtStage0) {
  const int64_t expected = dstest::count_parameters(kModel);
  auto model = std::make_shared<gpt::GPTImpl>(kModel);
  EXPECT_EQ(deepspeed::count_parameters(*model), expected);
  auto engine = deepspeed::initialize<gpt::GPTImpl>(
                    {.model = model,
                     .config_json = dstest::base_config(2, 1, 0),
                     .comm = deepspeed::comm::make_single_process_communicator()})
                    .engine;
  EXPECT_EQ(deepspeed::count_parameters(*model), expected);
  EXPECT_EQ(naive_count(*model), expected);
}

TEST(CountParameters, TiedWeightCountsOnce) {
  dstest::TiedModelImpl model;
  const int64_t embed = dstest::kVocab * dstest::kWidth;
  const int64_t mlp = (dstest::kWidth * 4 * dstest::kWidth + 4 * dstest::kWidth) +
                      (4 * dstest::kWidth * dstest::kWidth + dstest::kWidth);
  EXPECT_EQ(deepspeed::count_parameters(model), embed + mlp);
  EXPECT_EQ(naive_count(model), 2 * embed + mlp);  // the head holds the embedding's weight
}

// As gpt_train --zero_init builds it: before initialize() the blocks hold only this rank's slices;
// after it they are released between uses, and whole inside gathered_parameters().
TEST(CountParameters, Stage3UnderZeroInit) {
  const int64_t expected = dstest::count_parameters(kModel);
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    std::shared_ptr<gpt::GPTImpl> model;
    {
      deepspeed::zero::Init init(comm, true, torch::kFloat);
      model = std::make_shared<gpt::GPTImpl>(kModel);
    }
    EXPECT_LT(naive_count(*model), expected);
    EXPECT_EQ(deepspeed::count_parameters(*model), expected);
    auto engine = deepspeed::initialize<gpt::GPTImpl>(
                      {.model = model, .config_json = stage3_config(), .comm = comm})
                      .engine;
    EXPECT_EQ(model->named_parameters()["block1.mlp.fc.weight"].numel(), 0);
    EXPECT_EQ(deepspeed::count_parameters(*model), expected);
    {
      auto whole = engine->gathered_parameters();
      EXPECT_EQ(naive_count(*model), expected);
      EXPECT_EQ(deepspeed::count_parameters(*model), expected);
    }
    EXPECT_EQ(deepspeed::count_parameters(*model), expected);
  });
}

// Built whole, partitioned by initialize(); a frozen parameter inside a unit stays whole (the
// engine does not manage it) and counts once too; a tied weight (the root unit) counts once.
TEST(CountParameters, Stage3PartitionedByInitialize) {
  const int64_t expected = dstest::count_parameters(kModel);
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto model = std::make_shared<gpt::GPTImpl>(kModel);
    model->named_parameters()["block0.ln1.weight"].set_requires_grad(false);
    auto engine = deepspeed::initialize<gpt::GPTImpl>(
                      {.model = model, .config_json = stage3_config(), .comm = comm})
                      .engine;
    EXPECT_EQ(model->named_parameters()["block0.attn.qkv.weight"].numel(), 0);
    EXPECT_EQ(model->named_parameters()["block0.ln1.weight"].numel(), kModel.n_embd);
    EXPECT_EQ(deepspeed::count_parameters(*model), expected);

    auto tied = std::make_shared<dstest::TiedModelImpl>();
    const int64_t tied_expected = deepspeed::count_parameters(*tied);
    auto config = dstest::stage3_test_config(3);
    auto tied_engine = deepspeed::initialize<dstest::TiedModelImpl>(
                           {.model = tied, .config_json = config, .comm = comm})
                           .engine;
    EXPECT_EQ(tied->body->named_parameters()["fc.weight"].numel(), 0);
    EXPECT_EQ(deepspeed::count_parameters(*tied), tied_expected);
  });
}

}  // namespace count_parameters_test
