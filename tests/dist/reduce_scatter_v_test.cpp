// reduce_scatter_v: uneven segments (including empty ones, as a ZeRO-2 bucket that misses a
// partition gives), against the sum computed locally.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>

#include "deepspeed/comm.h"
#include "support/ranks.h"

namespace reduce_scatter_v_test {

using deepspeed::comm::CommunicatorPtr;
using deepspeed::comm::ReduceOp;

namespace {
// Rank r's input: deterministic values that differ per rank.
torch::Tensor input_of(int rank, int64_t n, torch::ScalarType dtype) {
  return (torch::arange(n, torch::kFloat) * 0.5 + rank * 10).to(dtype);
}

void check_world(int world, const std::vector<int64_t>& splits, torch::ScalarType dtype, ReduceOp op) {
  int64_t n = 0;
  for (auto s : splits) n += s;
  run_ranks(world, [&](CommunicatorPtr comm) {
    const int rank = comm->rank();
    auto in = input_of(rank, n, dtype);
    auto out = torch::empty({splits[rank]}, torch::TensorOptions().dtype(dtype));
    comm->reduce_scatter_v(out, in, splits, op)->wait();
    auto expected = torch::zeros({n});
    for (int r = 0; r < world; ++r) expected += input_of(r, n, torch::kFloat);
    if (op == ReduceOp::Avg) expected /= world;
    int64_t offset = 0;
    for (int r = 0; r < rank; ++r) offset += splits[r];
    auto want = expected.narrow(0, offset, splits[rank]);
    if (op == ReduceOp::Sum) {
      // Exact: every input is a multiple of 0.5 and every partial sum stays below 2^22 (fp32) or
      // needs at most 8 significant bits (bf16 case: integers/halves up to 90), so the order of
      // the additions cannot change the result. A shifted or duplicated chunk cannot hide in a
      // tolerance (allclose's 1e-2 relative was ~2e4 at the end of the 1,000,003 segment).
      EXPECT_TRUE(torch::equal(out, want.to(dtype)))
          << "rank " << rank << " max |diff| "
          << (out.to(torch::kFloat) - want).abs().max().item<float>();
    } else {
      // Avg: the exact sum divided by world in fp32; allow one ulp of the quotient, in case the
      // division is done as a multiplication by 1/world.
      auto got = out.to(torch::kFloat);
      auto ulp = torch::nextafter(want.abs(), torch::full_like(want, INFINITY)) - want.abs();
      EXPECT_TRUE((got - want).abs().le(ulp).all().item<bool>())
          << "rank " << rank << " got " << got << " want " << want;
    }
  });
}
}  // namespace

TEST(ReduceScatterV, UnevenAndEmptySegmentsAtWorldSizesTwoToFour) {
  check_world(2, {5, 0}, torch::kFloat, ReduceOp::Sum);
  check_world(2, {0, 7}, torch::kFloat, ReduceOp::Sum);
  check_world(3, {3, 0, 2}, torch::kFloat, ReduceOp::Sum);
  check_world(3, {0, 0, 6}, torch::kFloat, ReduceOp::Avg);
  check_world(4, {1, 2, 0, 1000003}, torch::kFloat, ReduceOp::Sum);
  check_world(4, {4, 4, 4, 4}, torch::kBFloat16, ReduceOp::Sum);
}

// ZeRO-2/3 average fp16 gradients with Avg (zero/gradient_scaling.h): the sum (80000) is past
// fp16's 65504, the mean (40000) is not, so the division must come before the rounding to fp16,
// on the shared-memory path (DS_SHM_ALLREDUCE unset: on) and on Gloo's all-to-all ("0").
TEST(ReduceScatterV, Fp16AvgDividesBeforeRoundingToFp16) {
  for (const char* shm : {"", "0"}) {
    ::setenv("DS_SHM_ALLREDUCE", shm, 1);
    try {
      run_ranks(2, [&](CommunicatorPtr comm) {
        auto in = torch::full({6}, 40000.0, torch::TensorOptions().dtype(torch::kHalf));
        auto out = torch::empty({3}, in.options());
        comm->reduce_scatter_v(out, in, {3, 3}, ReduceOp::Avg)->wait();
        EXPECT_TRUE(out.to(torch::kFloat).eq(40000).all().item<bool>())
            << "DS_SHM_ALLREDUCE='" << shm << "' rank " << comm->rank() << ": " << out;
      });
    } catch (...) {
      ::unsetenv("DS_SHM_ALLREDUCE");
      throw;
    }
  }
  ::unsetenv("DS_SHM_ALLREDUCE");
}

TEST(ReduceScatterV, SingleProcessKeepsTheWholeInput) {
  check_world(1, {9}, torch::kFloat, ReduceOp::Sum);
}

TEST(ReduceScatterV, MismatchedSplitsAreAnErrorNamingTheSizes) {
  run_ranks(2, [&](CommunicatorPtr comm) {
    auto in = torch::ones({6});
    auto out = torch::empty({3});
    try {
      comm->reduce_scatter_v(out, in, {3, 2}, ReduceOp::Sum);
      FAIL() << "accepted splits that do not sum to the input";
    } catch (const deepspeed::CommError& e) {
      EXPECT_NE(std::string(e.what()).find("splits sum to 5"), std::string::npos) << e.what();
    }
  });
}

}  // namespace reduce_scatter_v_test
