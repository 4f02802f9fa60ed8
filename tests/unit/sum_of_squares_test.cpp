// zero::sum_of_squares, behind every stage's global gradient norm (clipping, the fp16 overflow
// vote): the fp64 sum of a whole gradient partition, computed a chunk at a time so that the
// transient is at most a chunk's widened copy, not 16 bytes per element of the partition (in
// host memory none: one pass over a contiguous tensor).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "util/allocation_meter.h"
#include "zero/tensor_facts.h"

namespace sum_of_squares_test {

namespace {

using deepspeed::zero::sum_of_squares;

TEST(SumOfSquares, EqualsTheWholeTensorSumInFp64) {
  torch::manual_seed(5);
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    auto t = torch::randn({(1 << 20) + 123}).to(dtype);  // four chunks and a bit
    const double whole = t.to(torch::kDouble).pow(2).sum().item<double>();
    const at::Tensor sum = sum_of_squares(t);
    EXPECT_EQ(sum.dim(), 0);
    EXPECT_EQ(sum.scalar_type(), torch::kDouble);
    EXPECT_NEAR(sum.item<double>(), whole, 1e-12 * whole) << c10::toString(dtype);
  }
  EXPECT_EQ(sum_of_squares(torch::empty({0})).item<double>(), 0.0);
  EXPECT_EQ(sum_of_squares(at::Tensor()).item<double>(), 0.0);  // no gradient at all
  EXPECT_EQ(sum_of_squares(torch::ones({3, 4})).item<double>(), 12.0);  // not only 1-D
  // Not contiguous (the chunked tensor operations): the same sum.
  auto m = torch::randn({513, 1031});
  const double want = m.to(torch::kDouble).pow(2).sum().item<double>();
  EXPECT_NEAR(sum_of_squares(m.t()).item<double>(), want, 1e-12 * want);
  EXPECT_NEAR(sum_of_squares(m.slice(1, 0, 1031, 2)).item<double>(),
              m.slice(1, 0, 1031, 2).to(torch::kDouble).pow(2).sum().item<double>(), 1e-12 * want);
}

// A contiguous tensor in host memory is read in one pass, its chunks' sums added in chunk order:
// no temporary tensor, and the same bits whatever libtorch's thread count (a norm that moved with
// OMP_NUM_THREADS would make runs differ in their clipping).
TEST(SumOfSquares, OnePassWithTheSameBitsOnAnyThreadCount) {
  torch::manual_seed(6);
  const int threads = at::get_num_threads();
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    auto t = torch::randn({(3 << 18) + 77}).to(dtype);
    at::set_num_threads(1);
    const double one = sum_of_squares(t).item<double>();
    at::set_num_threads(3);
    double three = 0;
    {
      deepspeed::util::AllocationMeter meter;
      three = sum_of_squares(t).item<double>();
      EXPECT_LT(meter.peak_bytes(), 1024) << c10::toString(dtype) << ": a temporary was made";
    }
    EXPECT_EQ(one, three) << c10::toString(dtype);
  }
  at::set_num_threads(threads);
}

// An inf or NaN anywhere (the fp16 overflow vote reads it) survives the chunking.
TEST(SumOfSquares, AnOverflowInAnyChunkShows) {
  auto t = torch::zeros({(1 << 19) + 7});
  t[(1 << 19) + 3] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(sum_of_squares(t).item<double>()));
  t[(1 << 19) + 3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(sum_of_squares(t).item<double>()));
}

// A 16 MiB fp32 gradient: widening it whole would hold 64 MiB (the fp64 copy and its square);
// chunk by chunk the transients are a few MiB.
TEST(SumOfSquares, HoldsAChunkNotTheWholeTensorWidened) {
  auto t = torch::randn({1 << 22});
  deepspeed::util::AllocationMeter meter;
  const double sum = sum_of_squares(t).item<double>();
  EXPECT_GT(sum, 0.0);
  EXPECT_LT(meter.peak_bytes(), 8 << 20) << "peak " << meter.peak_bytes() << " bytes";
}

}  // namespace

}  // namespace sum_of_squares_test
