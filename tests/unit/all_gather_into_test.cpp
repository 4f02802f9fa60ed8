// Communicator::all_gather_into's default implementation (an all_gather into a temporary, copied
// out into each rank's view on wait()), through FakeCommunicator, which does not override it: the
// NCCL and single-process communicators use this path.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "support/expect.h"
#include "support/fake_communicator.h"

namespace all_gather_into_test {

namespace comm = deepspeed::comm;
using dstest::CallRecord;
using dstest::FakeCommunicator;

// Rank 1 of 3; peer r passes `mine` + 10 * r. Chunk [2, 4) of each rank's 5-element partition
// of a 15-element buffer: the views are strided across the buffer, as ParamGather's chunks.
TEST(AllGatherInto, TheDefaultCopiesEachRanksInputIntoItsView) {
  FakeCommunicator c(1, 3, [](const CallRecord&, int peer, const at::Tensor& mine) {
    return mine + 10 * peer;
  });
  at::Tensor buffer = torch::zeros({15}, at::kBFloat16);
  std::vector<at::Tensor> views;
  for (int r = 0; r < 3; ++r) views.push_back(buffer.narrow(0, r * 5 + 2, 2));
  views[1].copy_(torch::tensor({3.f, 4.f}));  // this rank's chunk, gathered from itself
  comm::WorkPtr work = c.all_gather_into(views, views[1]);
  work->wait();
  at::Tensor expected = torch::zeros({15}, at::kBFloat16);
  expected.narrow(0, 2, 2).copy_(torch::tensor({3.f, 4.f}));    // rank 0: x + 0 (x = rank 1's)
  expected.narrow(0, 7, 2).copy_(torch::tensor({3.f, 4.f}));    // rank 1: x
  expected.narrow(0, 12, 2).copy_(torch::tensor({23.f, 24.f}));  // rank 2: x + 20
  EXPECT_TRUE(buffer.equal(expected)) << buffer;
  ASSERT_EQ(c.calls().size(), 1u);
  EXPECT_EQ(c.calls()[0].kind, "all_gather");  // counted and checked as one
  EXPECT_EQ(c.calls()[0].numel, 2);
}

TEST(AllGatherInto, AnInputNotAmongTheOutputsLandsInThisRanksOutputToo) {
  FakeCommunicator c(0, 2);  // the peer passes what this rank passes
  std::vector<at::Tensor> outs{torch::zeros({2, 2}), torch::zeros({2, 2}).t()};
  c.all_gather_into(outs, torch::tensor({1.f, 2.f, 3.f, 4.f}))->wait();
  EXPECT_TRUE(outs[0].equal(torch::tensor({1.f, 2.f, 3.f, 4.f}).view({2, 2})));
  EXPECT_TRUE(outs[1].equal(torch::tensor({1.f, 2.f, 3.f, 4.f}).view({2, 2})));
}

TEST(AllGatherInto, WrongOutputsAreRejectedNamingTheOutput) {
  FakeCommunicator c(0, 2);
  std::vector<at::Tensor> one{torch::zeros({3})};
  EXPECT_CONTAINS(dstest::message_of<deepspeed::CommError>(
                      [&] { c.all_gather_into(one, torch::zeros({3})); }),
                  "all_gather_into on rank 0 of 2: 1 outputs given, one per rank needed");
  std::vector<at::Tensor> sizes{torch::zeros({3}), torch::zeros({4})};
  EXPECT_CONTAINS(dstest::message_of<deepspeed::CommError>(
                      [&] { c.all_gather_into(sizes, torch::zeros({3})); }),
                  "output 1 (4 elements) must have the input's 3 elements and dtype");
  EXPECT_TRUE(c.calls().empty());
}

}  // namespace all_gather_into_test
