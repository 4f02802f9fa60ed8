// device::DownloadQueue: buckets coming down from a GPU go into host memory in order, without the
// host waiting until more than four are pending (fences held back by the test, as a GPU's would
// arrive), and a copy is applied exactly once even when applying it throws.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>
#include <vector>

#include "device/download_queue.h"
#include "support/held_downloads.h"

namespace download_queue_test {

using deepspeed::device::DownloadQueue;
using dstest::HeldDownloads;

namespace {

class DownloadQueueTest : public ::testing::Test {
 protected:
  HeldDownloads downloads;
  DownloadQueue<int> queue{downloads.downloader()};
  std::vector<int> applied;
  void apply(bool wait_all) {
    queue.apply(wait_all, [&](const at::Tensor& values, int place) {
      EXPECT_EQ(values.item<float>(), float(place)) << "the copy that belongs to its place";
      applied.push_back(place);
    });
  }
};

// Arrived copies go in oldest first, and one still coming holds back those behind it (a later
// copy may add to what it writes).
TEST_F(DownloadQueueTest, AppliesArrivedCopiesInOrderWithoutWaiting) {
  for (int i = 0; i < 3; ++i) queue.push(torch::full({1}, float(i)), i);
  downloads.release(1);
  apply(false);
  EXPECT_TRUE(applied.empty()) << "the first is still coming";
  downloads.release(0);
  apply(false);
  EXPECT_EQ(applied, (std::vector<int>{0, 1}));
  EXPECT_EQ(queue.size(), 1u);
  EXPECT_EQ(downloads.blocking_waits, 0);
  apply(true);
  EXPECT_EQ(applied, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(downloads.blocking_waits, 1);
  EXPECT_TRUE(queue.empty());
}

// Beyond four pending the host waits for the oldest, and only for it.
TEST_F(DownloadQueueTest, WaitsOnlyBeyondFourPending) {
  for (int i = 0; i < 5; ++i) queue.push(torch::full({1}, float(i)), i);
  apply(false);
  EXPECT_EQ(applied, (std::vector<int>{0}));
  EXPECT_EQ(downloads.blocking_waits, 1);
  EXPECT_EQ(queue.size(), 4u);
}

// An apply that throws still takes its copy out of the queue: the next call does not apply it a
// second time (a gradient added twice).
TEST_F(DownloadQueueTest, ACopyWhoseApplyThrowsIsNotAppliedAgain) {
  for (int i = 0; i < 2; ++i) queue.push(torch::full({1}, float(i)), i);
  downloads.release(0);
  downloads.release(1);
  EXPECT_THROW(queue.apply(false, [](const at::Tensor&, int) { throw std::runtime_error("io"); }),
               std::runtime_error);
  apply(true);
  EXPECT_EQ(applied, (std::vector<int>{1}));
}

// The copies count in host memory while pending, and their buckets on the GPU (a meta tensor
// stands in) until the copy has read them; the peaks stay.
TEST_F(DownloadQueueTest, CountsCopiesAndTheBucketsTheyStillRead) {
  const auto on_gpu = torch::TensorOptions().device(torch::kMeta);
  queue.push(torch::empty({3}, on_gpu), 1);
  queue.push(torch::empty({5}, on_gpu), 1);
  EXPECT_EQ(queue.host_bytes(), 8 * 4);
  EXPECT_EQ(queue.device_bytes(), 8 * 4);
  downloads.release(0);
  EXPECT_EQ(queue.device_bytes(), 5 * 4) << "a passed copy's bucket is free on the GPU";
  EXPECT_EQ(queue.host_bytes(), 8 * 4) << "its copy is not, until applied";
  queue.apply(true, [](const at::Tensor&, int) {});
  EXPECT_EQ(queue.host_bytes(), 0);
  EXPECT_EQ(queue.device_bytes(), 0);
  EXPECT_EQ(queue.peak_host_bytes(), 8 * 4);
  EXPECT_EQ(queue.peak_device_bytes(), 8 * 4);
  // A host tensor handed in as it is (the CPU path) is the caller's, not a copy.
  DownloadQueue<int> on_cpu{deepspeed::device::stream_downloader(c10::kCPU)};
  on_cpu.push(torch::ones({4}), 0);
  EXPECT_EQ(on_cpu.host_bytes(), 0);
  EXPECT_EQ(on_cpu.device_bytes(), 0);
}

// drop() waits for each copy (its memory may be freed with it) and applies none; clear() only
// forgets them.
TEST_F(DownloadQueueTest, DropWaitsClearForgets) {
  for (int i = 0; i < 2; ++i) queue.push(torch::full({1}, float(i)), i);
  queue.drop();
  EXPECT_EQ(downloads.blocking_waits, 2);
  EXPECT_TRUE(queue.empty());
  queue.push(torch::full({1}, 2.f), 2);
  queue.clear();
  EXPECT_EQ(downloads.blocking_waits, 2);
  apply(true);
  EXPECT_TRUE(applied.empty());
}

}  // namespace

}  // namespace download_queue_test
