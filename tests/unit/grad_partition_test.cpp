// zero::GradPartition: the one interface the reducing stages put reduced buckets through. Both
// homes (the device tensor, ZeRO-Offload's host partition) must hold the same values and the
// same boundary norm for the same buckets, which is what lets the stages stop asking which one
// they have. Also util/ranges.h's uncovered(), the "what no bucket wrote" rule three owners share.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "util/ranges.h"
#include "zero/grad_partition.h"
#include "zero/stage_options.h"

namespace grad_partition_test {

namespace {

using deepspeed::ElementRange;
using deepspeed::uncovered;
using deepspeed::zero::DeviceGradPartition;
using deepspeed::zero::GradPartition;
using deepspeed::zero::make_grad_partition;

TEST(Uncovered, GapsBeforeBetweenAndAfterTheRanges) {
  // Given out of order, as buckets finish.
  std::vector<ElementRange> covered{{6, 2}, {2, 3}};
  EXPECT_EQ(uncovered(covered, 10, "test"), (std::vector<ElementRange>{{0, 2}, {5, 1}, {8, 2}}));
  EXPECT_EQ(uncovered({{0, 4}, {4, 6}}, 10, "test"), std::vector<ElementRange>{});
  EXPECT_EQ(uncovered({}, 3, "test"), (std::vector<ElementRange>{{0, 3}}));
}

TEST(Uncovered, OverlapsAndRangesPastTheEndNameTheCaller) {
  try {
    uncovered({{0, 5}, {4, 2}}, 10, "GradStore");
    FAIL() << "overlapping ranges accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("GradStore: ranges overlap at element 4"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(uncovered({{8, 4}}, 10, "test"), c10::Error);
}

double squares(const at::Tensor& t) { return t.to(torch::kDouble).pow(2).sum().item<double>(); }

// One micro-step: two buckets that tile a partition of 10, [6, 10) finishing first.
void micro_step(GradPartition& p, const at::Tensor& values, bool boundary) {
  p.begin_micro_step(boundary);
  for (auto [begin, numel] : {ElementRange{6, 4}, ElementRange{0, 6}}) {
    auto fence = p.accumulate(begin, values.narrow(0, begin, numel));
    if (fence) fence->wait();
  }
  p.end_micro_step();
}

class BothHomes : public ::testing::TestWithParam<bool> {};

TEST_P(BothHomes, AccumulateOverMicroStepsAndStartAfreshAfterClear) {
  const bool in_host_memory = GetParam();
  auto p = make_grad_partition(10, torch::kFloat, torch::kCPU, in_host_memory, /*pin=*/false);
  EXPECT_EQ(p->in_host_memory(), in_host_memory);
  EXPECT_EQ(p->bytes(), 40);
  EXPECT_TRUE(torch::equal(p->tensor(), torch::zeros({10})));
  auto a = torch::randn({10}), b = torch::randn({10}), c = torch::randn({10});

  micro_step(*p, a, false);
  micro_step(*p, b, true);
  p->wait();
  EXPECT_TRUE(torch::allclose(p->tensor(), a + b));
  EXPECT_NEAR(p->squared_norm().item<double>(), squares(a + b), 1e-9);
  EXPECT_EQ(p->squared_norm().sizes(), (std::vector<int64_t>{1}));
  EXPECT_EQ(p->squared_norm().scalar_type(), torch::kDouble);

  p->clear();  // a step: the next accumulation starts from nothing
  micro_step(*p, c, true);
  p->wait();
  EXPECT_TRUE(torch::equal(p->tensor(), c));
  EXPECT_NEAR(p->squared_norm().item<double>(), squares(c), 1e-9);
  EXPECT_THROW(p->accumulate(8, torch::ones({4})), c10::Error);  // outside the partition
}

INSTANTIATE_TEST_SUITE_P(GradPartition, BothHomes, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Host" : "Device"; });

// The all-reduce stages' partition is a view of their full gradient buffer: it writes there.
TEST(DeviceGradPartition, AnAdoptedViewWritesIntoItsBuffer) {
  auto buffer = torch::zeros({12});
  DeviceGradPartition p(buffer.narrow(0, 4, 4));
  EXPECT_EQ(p.accumulate(1, torch::ones({2})), nullptr);  // nothing to wait for on the device
  EXPECT_TRUE(torch::equal(buffer, torch::tensor({0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0}).to(torch::kFloat)));
  p.clear();
  EXPECT_EQ(buffer.sum().item<float>(), 0.0f);
}

// zero_optimization.release_gradients: clear() frees the memory (the same accumulation otherwise),
// the next use allocates zeros again, and the size counts whether held or not. A partition that
// does not release keeps its storage: the one the step read is the one the next backward adds to.
TEST(DeviceGradPartition, AReleasingPartitionHoldsNoMemoryBetweenAStepAndItsNextUse) {
  DeviceGradPartition p(10, torch::kFloat, torch::kCPU, /*release=*/true);
  EXPECT_FALSE(p.holds_memory());  // nothing before its first use either
  EXPECT_EQ(p.bytes(), 40);
  auto a = torch::randn({10}), c = torch::randn({10});
  micro_step(p, a, true);
  EXPECT_TRUE(torch::equal(p.tensor(), a));
  p.clear();
  EXPECT_FALSE(p.holds_memory());
  EXPECT_EQ(p.bytes(), 40);  // the step's figure, held or not
  micro_step(p, c, true);    // allocated again at the first bucket, as zeros + c
  ASSERT_TRUE(p.holds_memory());
  EXPECT_TRUE(torch::equal(p.tensor(), c));
  p.clear();
  EXPECT_TRUE(torch::equal(p.tensor(), torch::zeros({10})));  // read with no backward: zeros
  EXPECT_NEAR(p.squared_norm().item<double>(), 0.0, 0.0);

  // release() frees only a releasing partition; acquire_uninitialized() hands back a held one
  // as it is.
  DeviceGradPartition kept(10, torch::kFloat, torch::kCPU);
  micro_step(kept, a, true);
  const void* storage = kept.tensor().data_ptr();
  kept.release();
  ASSERT_TRUE(kept.holds_memory());
  EXPECT_EQ(kept.acquire_uninitialized().data_ptr(), storage);
  EXPECT_TRUE(torch::equal(kept.tensor(), a));
  kept.clear();
  EXPECT_EQ(kept.tensor().data_ptr(), storage);
  EXPECT_TRUE(torch::equal(kept.tensor(), torch::zeros({10})));
  p.release();
  EXPECT_FALSE(p.holds_memory());
  EXPECT_EQ(p.acquire_uninitialized().numel(), 10);
}

// The engine's rule: the key when given, else on a GPU only.
TEST(ReleasesGradients, TheKeyWhenGivenElseOnAGpu) {
  using deepspeed::zero::ReductionOptions;
  using deepspeed::zero::releases_gradients;
  ReductionOptions o;
  EXPECT_FALSE(releases_gradients(o, torch::kCPU));
  EXPECT_TRUE(releases_gradients(o, c10::Device(torch::kCUDA, 0)));
  o.release_gradients = true;
  EXPECT_TRUE(releases_gradients(o, torch::kCPU));
  o.release_gradients = false;
  EXPECT_FALSE(releases_gradients(o, c10::Device(torch::kCUDA, 0)));
}

}  // namespace

}  // namespace grad_partition_test
