// Stage 3 keeps a released unit's host buffer of 32 MiB or more for its next gather
// (zero/stage3/spare_buffers.h): the kept bytes show in the memory report as gathered memory, a
// unit regathered into its own kept buffer trains exactly as stage 0 does, and the kept bytes stay
// within stage3_max_live_parameters. SpareBuffers' own rules are tested here too.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <vector>

#include "support/ranks.h"
#include "support/stage3_models.h"
#include "zero/stage3/spare_buffers.h"

namespace stage3_spare_buffers_test {

namespace {
using deepspeed::ZeroUnit;
using deepspeed::zero::SpareBuffers;

// One unit of 4096 x 2048 + the two small projections: 8.5M fp32 elements, over 32 MiB gathered.
constexpr int64_t kWide = 4096, kInner = 2048;
struct BigImpl : torch::nn::Module {
  BigImpl() {
    in = register_module("in", torch::nn::Linear(dstest::kWidth, kInner));
    out = register_module("out", torch::nn::Linear(kWide, dstest::kWidth));
    wide = register_parameter("wide", torch::randn({kWide, kInner}) * 0.01);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = deepspeed::zero::linear(x, in->weight, in->bias);
    h = deepspeed::zero::linear(torch::gelu(h), wide);
    return x + deepspeed::zero::linear(h, out->weight, out->bias);
  }
  torch::nn::Linear in{nullptr}, out{nullptr};
  torch::Tensor wide;
};
TORCH_MODULE(Big);

struct BigModelImpl : torch::nn::Module {
  BigModelImpl() {
    embed = register_module("embed", torch::nn::Embedding(dstest::kVocab, dstest::kWidth));
    big = register_module("big", std::make_shared<ZeroUnit<Big>>(Big()));
    head = register_module("head", torch::nn::Linear(dstest::kWidth, dstest::kVocab));
  }
  torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets) {
    auto x = big->forward(embed->forward(idx));
    auto logits = deepspeed::zero::linear(x, head->weight, head->bias);
    return torch::nn::functional::cross_entropy(logits.reshape({-1, dstest::kVocab}),
                                                targets.reshape({-1}));
  }
  torch::nn::Embedding embed{nullptr};
  std::shared_ptr<ZeroUnit<Big>> big;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(BigModel);

int64_t unit_numel() {
  return kInner * (dstest::kWidth + 1) + kWide * kInner + dstest::kWidth * (kWide + 1);
}
int64_t root_numel() {
  return dstest::kVocab * dstest::kWidth + dstest::kVocab * (dstest::kWidth + 1);
}

struct Trained {
  std::vector<double> losses;                        // rank 0's
  std::vector<deepspeed::MemoryReport> after_backward;  // rank 0's, one a step
};

Trained train(const nlohmann::json& config, int steps) {
  Trained run;
  std::mutex mu;
  // Built here, one after the other: rank threads drawing from the one global generator at once
  // would build rank 0's model differently in every run (initialize() broadcasts rank 0's).
  std::vector<BigModel> models;
  for (int r = 0; r < 2; ++r) {
    torch::manual_seed(11);
    models.emplace_back();
  }
  dstest::run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto engine = dstest::engine_over(models[comm->rank()].ptr(), config, comm);
    for (int64_t step = 0; step < steps; ++step) {
      auto b = dstest::token_batch(comm->rank(), step);
      auto loss = engine->forward(b.idx, b.targets);
      engine->backward(loss);
      auto memory = engine->memory_report();
      engine->step();
      if (comm->rank() != 0) continue;
      std::lock_guard<std::mutex> lock(mu);
      run.losses.push_back(loss.item<double>());
      run.after_backward.push_back(memory);
    }
  });
  return run;
}
}  // namespace

TEST(Stage3SpareBuffers, KeptAfterReleaseCountedAndTrainingUnchanged) {
  const int steps = 3;
  Trained zero = train(dstest::stage3_test_config(0), steps);
  Trained three = train(dstest::stage3_test_config(3), steps);
  ASSERT_EQ(three.losses.size(), static_cast<size_t>(steps));
  for (int s = 0; s < steps; ++s) {
    EXPECT_NEAR(three.losses[s], zero.losses[s], 1e-6 * std::abs(zero.losses[s])) << "step " << s;
    // After backward every unit is released: what stays gathered is the root and the big unit's
    // buffer, kept (its padded numel, rounded up to 2 ranks).
    const auto& m = three.after_backward[s];
    EXPECT_EQ(m.gathered_numel, 0) << "step " << s;
    EXPECT_GE(m.gathered_bytes, (root_numel() + unit_numel()) * 4) << "step " << s;
    EXPECT_LT(m.gathered_bytes, (root_numel() + unit_numel()) * 4 + 4096) << "step " << s;
  }
}

TEST(Stage3SpareBuffers, NothingKeptBeyondMaxLive) {
  auto config = dstest::stage3_test_config(3);
  config["zero_optimization"]["stage3_max_live_parameters"] = unit_numel() + 64;
  config["zero_optimization"]["stage3_prefetch_bucket_size"] = 1;
  Trained ok = train(config, 2);
  EXPECT_GE(ok.after_backward[1].gathered_bytes, unit_numel() * 4);
  // Below the unit's size the bound yields to the unit in use, and nothing is kept beside it.
  config["zero_optimization"]["stage3_max_live_parameters"] = unit_numel() / 2;
  Trained tight = train(config, 2);
  EXPECT_LT(tight.after_backward[1].gathered_bytes, root_numel() * 4 + 4096);
}

TEST(SpareBuffers, KeepsLargeUnreferencedHostBuffersAndTakesByExactSize) {
  SpareBuffers spares(/*min_bytes=*/1024);
  const auto fp32 = at::TensorOptions().dtype(at::kFloat);
  EXPECT_FALSE(spares.worth_keeping(at::empty({16}, fp32)));  // 64 bytes: below the minimum
  at::Tensor big = at::empty({1024}, fp32);
  at::Tensor view = big.narrow(0, 0, 8);
  EXPECT_FALSE(spares.worth_keeping(big));  // a view still reads its storage
  view = at::Tensor();
  ASSERT_TRUE(spares.worth_keeping(big));
  EXPECT_FALSE(spares.worth_keeping(big.narrow(0, 0, 512)));  // not the buffer itself
  const void* where = big.data_ptr();
  spares.keep(std::move(big));
  EXPECT_EQ(spares.numel(), 1024);
  EXPECT_EQ(spares.bytes(), 4096);
  EXPECT_FALSE(spares.take(1023, fp32).defined());
  EXPECT_FALSE(spares.take(1024, fp32.dtype(at::kBFloat16)).defined());
  at::Tensor again = spares.take(1024, fp32);
  ASSERT_TRUE(again.defined());
  EXPECT_EQ(again.data_ptr(), where);
  EXPECT_EQ(spares.bytes(), 0);
  spares.keep(std::move(again));
  spares.keep(at::empty({2048}, fp32));
  spares.shrink_to(2048);  // the oldest goes first
  EXPECT_EQ(spares.numel(), 2048);
  EXPECT_FALSE(spares.take(1024, fp32).defined());
  spares.shrink_to(0);
  EXPECT_EQ(spares.bytes(), 0);
}

}  // namespace stage3_spare_buffers_test
