// Where gradient buckets are cut: reduce_bucket_size is a cap, as in DeepSpeed (which reduces its
// bucket before a gradient would overflow it), not a floor: a bucket holds at most that many
// elements, and a larger parameter is a bucket of its own. Stages 1/2 (make_bucket_ranges over
// the flat buffer) and stage 3 (per unit, seen through the reduce-scatters it issues); fp32
// stage 0's buckets are checked in fake_communicator_test.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "deepspeed/deepspeed.h"
#include "support/fake_communicator.h"
#include "zero/flat_params.h"

namespace gradient_buckets_test {

using deepspeed::zero::BucketRange;
using deepspeed::zero::FlatParams;
using deepspeed::zero::make_bucket_ranges;

namespace {

// Parameters of these sizes in registration order; the flat buffer lays them in reverse.
std::vector<at::Tensor> params_of(const std::vector<int64_t>& numels) {
  std::vector<at::Tensor> params;
  for (int64_t n : numels) params.push_back(torch::zeros({n}).requires_grad_());
  return params;
}

// Each bucket's parameter sizes, in buffer order.
std::vector<std::vector<int64_t>> sizes_of(const FlatParams& flat,
                                           const std::vector<BucketRange>& buckets) {
  std::vector<std::vector<int64_t>> out;
  for (const auto& b : buckets) {
    out.emplace_back();
    for (size_t s : b.slots) out.back().push_back(flat.slots()[s].numel);
  }
  return out;
}

}  // namespace

TEST(GradientBuckets, FlatBucketsHoldAtMostReduceBucketSize) {
  // Buffer order: 2, 2, 10, 5, 3 (+ padding to the partition alignment of two ranks).
  FlatParams flat(params_of({3, 5, 10, 2, 2}), 2, deepspeed::partition::kAlignment);
  using Sizes = std::vector<std::vector<int64_t>>;
  // 2 + 2 + 10 would be 14 > 6: the 10 starts its own bucket, alone (larger than the cap);
  // 5 + 3 = 8 > 6 likewise.
  EXPECT_EQ(sizes_of(flat, make_bucket_ranges(flat, 6)), (Sizes{{2, 2}, {10}, {5}, {3}}));
  EXPECT_EQ(sizes_of(flat, make_bucket_ranges(flat, 8)), (Sizes{{2, 2}, {10}, {5, 3}}));
  EXPECT_EQ(sizes_of(flat, make_bucket_ranges(flat, 14)), (Sizes{{2, 2, 10}, {5, 3}}));
  // reduce_bucket_size 0 (read as 1: stage_options.cpp): every parameter alone, as DeepSpeed.
  EXPECT_EQ(sizes_of(flat, make_bucket_ranges(flat, 1)), (Sizes{{2}, {2}, {10}, {5}, {3}}));
  // Contiguous, every element once, the last running to the padded end.
  const auto buckets = make_bucket_ranges(flat, 6);
  EXPECT_EQ(buckets.front().begin, 0);
  for (size_t b = 1; b < buckets.size(); ++b) EXPECT_EQ(buckets[b].begin, buckets[b - 1].end);
  EXPECT_EQ(buckets.back().end, flat.layout().padded_numel);
  EXPECT_GT(flat.layout().padded_numel, 22) << "the case meant to include padding";
}

namespace {

// Parameters of 120, 120, 300, 120, 120 elements (symmetric: either order in the unit cuts
// alike), all in the root unit.
struct Flat : torch::nn::Module {
  Flat() {
    int i = 0;
    for (int64_t n : {120, 120, 300, 120, 120})
      params.push_back(register_parameter("p" + std::to_string(i++), torch::randn({n})));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor loss = torch::zeros({});
    for (auto& p : params) loss = loss + (p * x.mean()).sum();
    return loss;
  }
  std::vector<torch::Tensor> params;
};

}  // namespace

// Stage 3 as rank 0 of two mirrored ranks, reduce_bucket_size 130: one reduce-scatter per
// parameter (each 120 + 120 would pass 130; the 300 is alone), the unit's padding (780 -> 800)
// on its last bucket, which is launched first (stage 3 launches last to first). Before, a bucket
// grew until it held 130: 260 | 300 | 240.
TEST(GradientBuckets, Stage3BucketsHoldAtMostReduceBucketSize) {
  auto fake = std::make_shared<dstest::FakeCommunicator>(0, 2);
  torch::manual_seed(1);
  auto model = std::make_shared<Flat>();
  nlohmann::json config = {
      {"train_micro_batch_size_per_gpu", 2},
      {"steps_per_print", 0},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-2}}}}},
      {"zero_optimization", {{"stage", 3}, {"reduce_bucket_size", 130}}}};
  auto engine = deepspeed::initialize<Flat>({.model = model, .config_json = config, .comm = fake}).engine;
  fake->clear_calls();
  engine->backward(engine->forward(torch::randn({2, 8})));
  engine->step();
  std::vector<int64_t> buckets;
  for (const auto& call : fake->calls())
    if (call.kind == "reduce_scatter_v") buckets.push_back(call.numel);
  EXPECT_EQ(buckets, (std::vector<int64_t>{140, 120, 300, 120, 120}));
}

}  // namespace gradient_buckets_test
