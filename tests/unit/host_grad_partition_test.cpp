// zero::HostGradPartition: ZeRO-Offload's gradient partition in host memory. The first micro-step
// after clear() writes each reduced bucket into its place (no zeroing pass), later micro-steps
// add, and the boundary's sum of squares is summed as the buckets arrive. On the CPU the copies
// are synchronous; the GPU path (the download stream, the up-add-down of an accumulation) is the
// same calls in stream order, covered by tests/gpu.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <thread>

#include "support/held_downloads.h"
#include "zero/host_grad_partition.h"

namespace host_grad_partition_test {

namespace {

using deepspeed::zero::HostGradPartition;

double squares(const at::Tensor& t) { return t.to(torch::kDouble).pow(2).sum().item<double>(); }

// Two buckets that tile a partition of 10: [0, 6) and [6, 10).
// (A pageable partition gives no fence: its values are there after wait().)
// (On the CPU a direct copy is done when accumulate returns; a staged one is put in by a later
// call on this thread, so this thread never waits on its fence.)
void reduce(HostGradPartition& p, const at::Tensor& values) {
  for (auto [begin, numel] : {std::pair<int64_t, int64_t>{0, 6}, {6, 4}})
    p.accumulate(begin, values.narrow(0, begin, numel));
}

// One micro-step's backward: both buckets reduced.
void micro_step(HostGradPartition& p, const at::Tensor& values, bool boundary) {
  p.begin_micro_step(boundary);
  reduce(p, values);
  p.end_micro_step();
}

TEST(HostGradPartition, FirstMicroStepWritesLaterOnesAdd) {
  HostGradPartition p(10, torch::kFloat, torch::kCPU, /*pin=*/false);
  EXPECT_TRUE(p.tensor().is_cpu());
  EXPECT_TRUE(torch::equal(p.tensor(), torch::zeros({10})));  // zeros before any backward
  auto a = torch::randn({10}), b = torch::randn({10}), c = torch::randn({10});

  micro_step(p, a, false);
  micro_step(p, b, true);
  EXPECT_TRUE(torch::allclose(p.tensor(), a + b));
  EXPECT_NEAR(p.squared_norm().item<double>(), squares(a + b), 1e-9);

  // After the step: the next accumulation overwrites what is there (no zeroing pass needed).
  p.clear();
  micro_step(p, c, true);
  EXPECT_TRUE(torch::equal(p.tensor(), c));
  // Only the last boundary's values count: not a+b's, and not summed over steps.
  EXPECT_NEAR(p.squared_norm().item<double>(), squares(c), 1e-9);
}

// The norm counts the boundary's final values only, and an inf among them shows (fp16's vote).
TEST(HostGradPartition, SquaresAreTheBoundarysFinalValues) {
  HostGradPartition p(10, torch::kFloat, torch::kCPU, false);
  auto a = torch::ones({10}) * 3;
  micro_step(p, a, false);
  EXPECT_EQ(p.squared_norm().item<double>(), 0.0);  // no boundary yet
  p.begin_micro_step(true);
  auto b = torch::ones({10});
  b[7] = std::numeric_limits<float>::infinity();
  reduce(p, b);
  p.end_micro_step();
  EXPECT_TRUE(std::isinf(p.squared_norm().item<double>()));
  // squared_norm() hands out a copy: the caller may all-reduce it in place.
  at::Tensor sq = p.squared_norm();
  sq.zero_();
  EXPECT_TRUE(std::isinf(p.squared_norm().item<double>()));
}

// A wider partition (grad_accum_dtype fp32) takes 16-bit buckets and adds in its own dtype.
TEST(HostGradPartition, AddsInThePartitionsDtype) {
  HostGradPartition p(10, torch::kFloat, torch::kCPU, false);
  auto a = torch::randn({10}).to(torch::kBFloat16), b = torch::randn({10}).to(torch::kBFloat16);
  micro_step(p, a, false);
  micro_step(p, b, true);
  EXPECT_EQ(p.tensor().scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(p.tensor(), a.to(torch::kFloat) + b.to(torch::kFloat)));
}

// A backward that threw after writing part of a fresh accumulation leaves the rest holding the
// previous step's gradients: the next micro-step starts from zeros, as a device partition would
// (the failed micro-step's part stays, as it would there).
TEST(HostGradPartition, AFailedFirstMicroStepLeavesNoEarlierGradients) {
  HostGradPartition p(10, torch::kFloat, torch::kCPU, false);
  auto old = torch::full({10}, 5.0f), part = torch::ones({6}), next = torch::randn({10});
  micro_step(p, old, true);
  p.clear();
  p.begin_micro_step(true);
  p.accumulate(0, part)->wait();  // ...and backward throws: no end_micro_step()
  micro_step(p, next, true);
  auto expected = next.clone();
  expected.narrow(0, 0, 6).add_(part);
  EXPECT_TRUE(torch::allclose(p.tensor(), expected));
}

// Overlapping writes in one micro-step are a bug upstream: the recovery after a failed backward
// reports it once, and the micro-step after that starts clean instead of failing forever.
TEST(HostGradPartition, AnOverlapIsReportedOnceNotForever) {
  HostGradPartition p(10, torch::kFloat, torch::kCPU, false);
  p.begin_micro_step(true);
  p.accumulate(0, torch::ones({6}))->wait();
  p.accumulate(4, torch::ones({6}))->wait();  // [4, 6) twice; then backward throws
  EXPECT_THROW(p.begin_micro_step(true), c10::Error);
  EXPECT_NO_THROW(p.begin_micro_step(true));
}

TEST(HostGradPartition, RangesOutsideThePartitionAreRefused) {
  HostGradPartition p(10, torch::kFloat, torch::kCPU, false);
  p.begin_micro_step(true);
  EXPECT_THROW(p.accumulate(8, torch::ones({4})), c10::Error);
  EXPECT_EQ(p.bytes(), 40);
}

}  // namespace

// ---- pageable (a GPU without pin_memory): buckets come down into page-locked copies ----------

using dstest::HeldDownloads;

class PageableHostGradPartition : public ::testing::Test {
 protected:
  HeldDownloads downloads;
  HostGradPartition p{10, torch::kFloat, torch::kCPU, /*pin=*/false, downloads.downloader()};
};

// A bucket goes in once its copy has arrived, found by a later call without waiting; wait() puts
// in the rest.
TEST_F(PageableHostGradPartition, BucketsGoInOnceTheirCopyArrivedWithoutWaiting) {
  auto a = torch::randn({10});
  p.begin_micro_step(false);
  auto first = p.accumulate(0, a.narrow(0, 0, 6));
  ASSERT_NE(first, nullptr);
  EXPECT_FALSE(first->passed()) << "passed before the copy is in the partition";
  EXPECT_EQ(p.copies_pending(), 1u);
  EXPECT_TRUE(torch::equal(p.tensor(), torch::zeros({10})));  // still on its way
  downloads.release(0);
  p.accumulate(6, a.narrow(0, 6, 4));
  EXPECT_EQ(p.copies_pending(), 1u);  // the first went in, found passed
  EXPECT_TRUE(first->passed());
  EXPECT_TRUE(torch::equal(p.tensor().narrow(0, 0, 6), a.narrow(0, 0, 6)));
  EXPECT_EQ(downloads.blocking_waits, 0);
  p.end_micro_step();
  p.wait();
  EXPECT_EQ(downloads.blocking_waits, 1);  // the second had not arrived
  EXPECT_EQ(p.copies_pending(), 0u);
  EXPECT_TRUE(torch::equal(p.tensor(), a));
}

// The same results as the direct path: the first micro-step writes, later ones add, and the
// boundary's squares are those of the final values (an add's summed on the host).
TEST_F(PageableHostGradPartition, WritesThenAddsAndCountsTheFinalValuesSquares) {
  auto a = torch::randn({10}), b = torch::randn({10}), c = torch::randn({10});
  micro_step(p, a, false);
  micro_step(p, b, true);
  EXPECT_NEAR(p.squared_norm().item<double>(), squares(a + b), 1e-9);
  EXPECT_TRUE(torch::allclose(p.tensor(), a + b));
  p.clear();
  micro_step(p, c, true);  // the boundary's overwrites: squares summed as they come down
  EXPECT_NEAR(p.squared_norm().item<double>(), squares(c), 1e-9);
  EXPECT_TRUE(torch::equal(p.tensor(), c));
}

// The host waits only beyond four copies pending, for the oldest.
TEST_F(PageableHostGradPartition, TheHostWaitsOnlyBeyondFourPending) {
  p.begin_micro_step(false);
  for (int i = 0; i < 5; ++i) p.accumulate(2 * i, torch::full({2}, float(i + 1)));
  EXPECT_EQ(downloads.blocking_waits, 1);
  EXPECT_EQ(p.copies_pending(), 4u);
  p.wait();
  EXPECT_TRUE(torch::equal(p.tensor(), torch::arange(1, 6).repeat_interleave(2).to(torch::kFloat)));
}

// A copy still pending at the next micro-step goes in before it (in order: the next adds to it),
// and a failed first micro-step leaves no earlier gradients, as in the direct path.
TEST_F(PageableHostGradPartition, AFailedFirstMicroStepLeavesNoEarlierGradients) {
  auto old = torch::full({10}, 5.0f), part = torch::ones({6}), next = torch::randn({10});
  micro_step(p, old, true);
  p.wait();
  p.clear();
  p.begin_micro_step(true);
  p.accumulate(0, part);  // ...and backward throws: no end_micro_step(), the copy still held
  micro_step(p, next, true);
  p.wait();
  auto expected = next.clone();
  expected.narrow(0, 0, 6).add_(part);
  EXPECT_TRUE(torch::allclose(p.tensor(), expected));
}

// A copy whose write throws (here: its values are not readable) was never written: a retry of the
// first micro-step finds that range holding an earlier step's gradients and zeroes it, as any
// range the failed micro-step did not write.
TEST(PageableHostGradPartitionErrors, ACopyThatFailedToGoInCountsAsNotWritten) {
  bool unreadable = false;
  HostGradPartition p{10, torch::kFloat, torch::kCPU, /*pin=*/false,
                      [&](const at::Tensor& reduced) {
                        auto arrived = std::make_shared<deepspeed::device::HostFence>();
                        arrived->signal();
                        at::Tensor host = unreadable ? torch::empty({reduced.numel()}, torch::kMeta)
                                                     : reduced.clone();
                        return deepspeed::device::Download{host, arrived};
                      }};
  micro_step(p, torch::full({10}, 5.0f), true);
  p.wait();
  p.clear();
  p.begin_micro_step(true);
  unreadable = true;
  EXPECT_ANY_THROW(p.accumulate(0, torch::ones({6})));  // its write fails: the backward throws
  unreadable = false;
  auto next = torch::randn({10});
  micro_step(p, next, true);
  p.wait();
  EXPECT_TRUE(torch::equal(p.tensor(), next)) << "the old 5s stayed in the failed copy's range";
}

// The page-locked copy itself can fail (out of page-locked memory): the range was never written
// either, and the retry zeroes it.
TEST(PageableHostGradPartitionErrors, ACopyThatCouldNotBeMadeCountsAsNotWritten) {
  bool fail = false;
  HostGradPartition p{10, torch::kFloat, torch::kCPU, /*pin=*/false,
                      [&](const at::Tensor& reduced) {
                        TORCH_CHECK(!fail, "CUDA out of memory (page-locked host memory)");
                        auto arrived = std::make_shared<deepspeed::device::HostFence>();
                        arrived->signal();
                        return deepspeed::device::Download{reduced.clone(), arrived};
                      }};
  micro_step(p, torch::full({10}, 5.0f), true);
  p.wait();
  p.clear();
  p.begin_micro_step(true);
  fail = true;
  EXPECT_ANY_THROW(p.accumulate(0, torch::ones({6})));
  fail = false;
  auto next = torch::randn({10});
  micro_step(p, next, true);
  p.wait();
  EXPECT_TRUE(torch::equal(p.tensor(), next)) << "the old 5s stayed in the failed copy's range";
}

// A copy that fails to go in after its micro-step ended (in wait() or squared_norm(), which no
// recovery follows) leaves its range zeroed, not holding an earlier step's gradients.
TEST(PageableHostGradPartitionErrors, ACopyThatFailedAfterTheMicroStepLeavesItsRangeZero) {
  HeldDownloads held;
  bool unreadable = false;
  auto downloader = held.downloader();
  HostGradPartition p{10, torch::kFloat, torch::kCPU, /*pin=*/false,
                      [&](const at::Tensor& reduced) {
                        auto d = downloader(reduced);
                        if (unreadable) d.host = torch::empty({reduced.numel()}, torch::kMeta);
                        return d;
                      }};
  p.begin_micro_step(true);
  p.accumulate(0, torch::full({10}, 5.0f));
  p.end_micro_step();
  p.wait();
  p.clear();
  p.begin_micro_step(true);
  unreadable = true;
  p.accumulate(0, torch::ones({6}));  // its copy has not arrived: held
  unreadable = false;
  p.end_micro_step();
  EXPECT_ANY_THROW(p.wait());
  EXPECT_TRUE(torch::equal(p.tensor().narrow(0, 0, 6), torch::zeros({6})))
      << p.tensor().narrow(0, 0, 6);
}

// The copies count as temporaries: the page-locked ones in host memory, and the buckets on the GPU
// that they still read (a meta tensor stands in for a GPU bucket).
TEST_F(PageableHostGradPartition, PendingCopiesAndTheirBucketsCount) {
  p.begin_micro_step(false);
  for (int i = 0; i < 3; ++i) p.accumulate(2 * i, torch::empty({2}, torch::device(torch::kMeta)));
  EXPECT_EQ(p.host_temporary_bytes(), 3 * 2 * 4);
  EXPECT_EQ(p.device_temporary_bytes(), 3 * 2 * 4);
  p.wait();
  EXPECT_TRUE(torch::equal(p.tensor().narrow(0, 0, 6), torch::ones({6})));
  EXPECT_EQ(p.host_temporary_bytes(), 3 * 2 * 4);  // peaks
}

// The update during backward waits on another thread for a range's values: the fence the
// partition gives passes once this thread has put the copy in (written(): every copy so far),
// and a copy that clear() drops cancels its fence, so that waiter is not left hanging.
TEST_F(PageableHostGradPartition, FencesPassOnceTheCopyIsInAndDroppedOnesCancel) {
  EXPECT_TRUE(p.written()->passed()) << "nothing pending";
  p.begin_micro_step(true);
  auto a = p.accumulate(0, torch::ones({4}));
  auto b = p.accumulate(4, torch::ones({6}));
  auto all = p.written();
  std::atomic<bool> woke{false};
  std::thread waiter([&] {
    all->wait();
    woke = true;
  });
  downloads.release(0);
  p.accumulate(10, torch::ones({0}));  // a later bucket: puts in the arrived copy
  EXPECT_TRUE(a->passed());
  EXPECT_FALSE(b->passed());
  EXPECT_FALSE(woke.load());
  p.end_micro_step();
  p.wait();  // puts in the rest: the waiter wakes
  waiter.join();
  EXPECT_TRUE(woke.load());
  EXPECT_TRUE(torch::equal(p.tensor(), torch::ones({10})));

  p.clear();
  p.begin_micro_step(true);
  auto dropped = p.accumulate(0, torch::ones({4}));
  std::thread cancelled([&] { EXPECT_THROW(dropped->wait(), c10::Error); });
  p.clear();  // the backward failed: the copy will never be put in
  cancelled.join();
  EXPECT_FALSE(dropped->passed());
}

// A boundary's backward that threw with an add still on its way: the add goes in before the retry
// restarts the squares, so only the retry's final values count.
TEST_F(PageableHostGradPartition, AFailedBoundarysPendingAddIsNotInTheRetrysNorm) {
  auto a = torch::randn({10}), part = torch::ones({6}), b = torch::randn({10});
  micro_step(p, a, false);
  p.begin_micro_step(true);
  p.accumulate(0, part);  // ...and backward throws, the copy still held
  micro_step(p, b, true);
  auto expected = a.clone();  // the order the partition adds in
  expected.narrow(0, 0, 6).add_(part);
  expected += b;
  EXPECT_NEAR(p.squared_norm().item<double>(), squares(expected), 1e-9);
  EXPECT_TRUE(torch::allclose(p.tensor(), expected));
}

// A wider partition takes 16-bit buckets through the copies too: written, then added, in its own
// dtype, and the boundary's squares are those of its values.
TEST(PageableHostGradPartitionDtypes, WritesAndAddsInThePartitionsDtype) {
  HeldDownloads downloads;
  HostGradPartition p(10, torch::kFloat, torch::kCPU, /*pin=*/false, downloads.downloader());
  auto a = torch::randn({10}).to(torch::kBFloat16), b = torch::randn({10}).to(torch::kBFloat16);
  micro_step(p, a, true);
  EXPECT_NEAR(p.squared_norm().item<double>(), squares(a.to(torch::kFloat)), 1e-9);
  micro_step(p, b, true);
  const auto sum = a.to(torch::kFloat) + b.to(torch::kFloat);
  EXPECT_NEAR(p.squared_norm().item<double>(), squares(sum), 1e-9);
  EXPECT_TRUE(torch::equal(p.tensor(), sum));
}

// Dropped gradients (after a step, or a discarded one) take their copies still pending with them:
// none lands in the next accumulation.
TEST_F(PageableHostGradPartition, ClearDropsTheCopiesStillPending) {
  auto stale = torch::full({10}, 7.0f), next = torch::randn({10});
  p.begin_micro_step(true);
  reduce(p, stale);
  EXPECT_EQ(p.copies_pending(), 2u);
  p.clear();
  EXPECT_EQ(p.copies_pending(), 0u);
  micro_step(p, next, true);
  p.wait();
  EXPECT_TRUE(torch::equal(p.tensor(), next));
}

}  // namespace host_grad_partition_test
