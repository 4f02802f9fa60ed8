#include <algorithm>
#include <set>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/data.h"
#include "deepspeed/errors.h"
#include "support/expect.h"

namespace data_loader_test {

using deepspeed::DataLoader;
using deepspeed::DistributedSampler;

namespace {
// Sample i is the scalar i, so batches show which indices were drawn.
class Counting : public deepspeed::Dataset {
 public:
  explicit Counting(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  deepspeed::Sample get(int64_t i) const override {
    return {torch::tensor({i}), torch::tensor({i})};
  }
 private:
  int64_t n_;
};
}  // namespace

TEST(DistributedSampler, RanksAreDisjointAndCoverTheEpoch) {
  for (int world : {1, 2, 3, 4}) {
    std::multiset<int64_t> seen;
    for (int r = 0; r < world; ++r) {
      DistributedSampler s(12, r, world, 5);
      for (auto i : s.indices()) seen.insert(i);
      EXPECT_EQ(s.num_samples(), 12 / world);
    }
    EXPECT_EQ(seen.size(), 12u);
    EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 12u) << "world " << world;
  }
}

TEST(DistributedSampler, PadsByRepeatingWhenNotDivisible) {
  std::vector<int64_t> all;
  for (int r = 0; r < 3; ++r) {
    DistributedSampler s(10, r, 3, 1);
    EXPECT_EQ(s.num_samples(), 4);
    auto idx = s.indices();
    all.insert(all.end(), idx.begin(), idx.end());
  }
  EXPECT_EQ(all.size(), 12u);
  EXPECT_EQ(std::set<int64_t>(all.begin(), all.end()).size(), 10u);
}

TEST(DistributedSampler, SeedAndEpochDetermineTheOrder) {
  DistributedSampler a(100, 0, 2, 42), b(100, 0, 2, 42), c(100, 0, 2, 43);
  EXPECT_EQ(a.indices(), b.indices());
  EXPECT_NE(a.indices(), c.indices());
  auto first = a.indices();
  a.set_epoch(1);
  EXPECT_NE(a.indices(), first);
}

TEST(DistributedSampler, RejectsBadRank) {
  EXPECT_THROW(DistributedSampler(10, 2, 2, 0), deepspeed::ConfigError);
  EXPECT_THROW(DistributedSampler(0, 0, 1, 0), deepspeed::ConfigError);
}

TEST(DataLoader, StepUnionEqualsOneProcessBatch) {
  auto data = std::make_shared<Counting>(64);
  DataLoader single(data, 8, 0, 1, 3);
  DataLoader r0(data, 4, 0, 2, 3), r1(data, 4, 1, 2, 3);
  for (int step = 0; step < 5; ++step) {
    auto big = single.next().data.flatten();
    auto both = torch::cat({r0.next().data.flatten(), r1.next().data.flatten()});
    auto a = std::get<0>(big.sort()), b = std::get<0>(both.sort());
    EXPECT_TRUE(torch::equal(a, b)) << "step " << step;
  }
}

TEST(DataLoader, RollsOverEpochsAndResumesFromState) {
  auto data = std::make_shared<Counting>(10);
  DataLoader loader(data, 3, 0, 1, 0, /*shuffle=*/true, /*drop_last=*/true);
  EXPECT_EQ(loader.batches_per_epoch(), 3);  // drop_last
  for (int i = 0; i < 4; ++i) loader.next();
  EXPECT_EQ(loader.state().epoch, 1);
  EXPECT_EQ(loader.state().batch_in_epoch, 1);
  auto saved = loader.state();
  auto expected = loader.next().data;
  DataLoader resumed(data, 3, 0, 1, 0, /*shuffle=*/true, /*drop_last=*/true);
  resumed.load_state(saved);
  EXPECT_TRUE(torch::equal(resumed.next().data, expected));
}

// Like DeepSpeed's loader (dataloader_drop_last false unless given), the default keeps the last,
// partial micro-batch of an epoch. Before, the constructor defaulted to dropping it.
TEST(DataLoader, DefaultKeepsThePartialLastMicroBatch) {
  auto data = std::make_shared<Counting>(10);
  DataLoader loader(data, 3, 0, 1, 0);
  ASSERT_EQ(loader.batches_per_epoch(), 4);
  std::vector<int64_t> sizes;
  std::set<int64_t> seen;
  for (int i = 0; i < 4; ++i) {
    auto batch = loader.next().data.flatten();
    sizes.push_back(batch.size(0));
    for (int64_t k = 0; k < batch.size(0); ++k) seen.insert(batch[k].item<int64_t>());
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{3, 3, 3, 1}));
  EXPECT_EQ(seen.size(), 10u);  // the whole epoch, each sample once
  EXPECT_EQ(loader.next().data.size(0), 3);  // the next epoch starts with a full micro-batch
  EXPECT_EQ(loader.state().epoch, 1);
}

// Across ranks the sampler pads every shard to the same length (10 samples at world 3: 4 each),
// so every rank has the same number of micro-batches and the same partial last one: the ranks'
// collectives stay matched.
TEST(DataLoader, PartialLastMicroBatchIsTheSameOnEveryRank) {
  auto data = std::make_shared<Counting>(10);
  for (int world : {2, 3}) {
    const int64_t per_rank = (10 + world - 1) / world;  // 5, 4
    for (int r = 0; r < world; ++r) {
      DataLoader loader(data, 3, r, world, 0);
      ASSERT_EQ(loader.batches_per_epoch(), 2) << "world " << world << " rank " << r;
      EXPECT_EQ(loader.next().data.size(0), 3);
      EXPECT_EQ(loader.next().data.size(0), per_rank - 3) << "world " << world << " rank " << r;
    }
  }
}

TEST(DataLoader, RangeForVisitsOneEpoch) {
  auto data = std::make_shared<Counting>(10);
  DataLoader loader(data, 2, 0, 1, 0, /*shuffle=*/false);
  int64_t n = 0, sum = 0;
  for (auto& batch : loader) {
    ++n;
    sum += batch.data.sum().item<int64_t>();
  }
  EXPECT_EQ(n, 5);
  EXPECT_EQ(sum, 45);
}

// The loader rolls over to a new shuffle each epoch (the sampler's seed + epoch): epoch 1 is not
// epoch 0 again. DeepSpeed 0.16's loader never advances its sampler's epoch (the same order every
// epoch unless the user calls set_epoch): docs/config.md, "Data loader".
TEST(DataLoader, EachEpochIsShuffledAnew) {
  auto data = std::make_shared<Counting>(12);
  DataLoader loader(data, 4, 0, 1, 3);
  ASSERT_EQ(loader.batches_per_epoch(), 3);
  std::vector<int64_t> epochs[2];
  for (auto& epoch : epochs)
    for (int b = 0; b < 3; ++b) {
      auto batch = loader.next().data.flatten();
      for (int64_t k = 0; k < batch.size(0); ++k) epoch.push_back(batch[k].item<int64_t>());
    }
  EXPECT_EQ(std::set<int64_t>(epochs[1].begin(), epochs[1].end()).size(), 12u);
  EXPECT_NE(epochs[0], epochs[1]);
}

// With drop_last, a rank's shard (ceil(5 / 2) = 3 samples) shorter than the micro-batch leaves
// an epoch of no micro-batch: the error names both arguments that decide it. Before, it named
// neither.
TEST(DataLoader, AnEpochOfNoMicroBatchNamesMicroBatchSizeAndDropLast) {
  auto data = std::make_shared<Counting>(5);
  const std::string msg = dstest::message_of<deepspeed::ConfigError>(
      [&] { DataLoader(data, 4, 0, 2, 0, /*shuffle=*/true, /*drop_last=*/true); });
  EXPECT_CONTAINS(msg, "micro_batch_size 4");
  EXPECT_CONTAINS(msg, "drop_last");
  EXPECT_CONTAINS(msg, "3 samples per rank");
}

}  // namespace data_loader_test
