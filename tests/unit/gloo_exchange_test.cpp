// post_exchange's order (every receive posted before any send, peers in rotation, empty
// messages skipped): the order is what makes each direction of a link run at its full rate
// (gloo_exchange.h), so a change that sends first is a regression these tests catch.
#include "comm/gloo_exchange.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>


namespace gloo_exchange_test {

namespace comm = deepspeed::comm;

struct Posted {
  char kind;  // 'r' receive, 's' send
  int peer;
  int64_t numel;
};

std::vector<Posted> posted_by(int rank, const std::vector<at::Tensor>& sends,
                              const std::vector<at::Tensor>& recvs) {
  std::vector<Posted> log;
  auto post = [&log](char kind) {
    return [&log, kind](const at::Tensor& t, int peer) { log.push_back({kind, peer, t.numel()}); };
  };
  comm::post_exchange(rank, sends, recvs, post('r'), post('s'));
  return log;
}

std::string order(const std::vector<Posted>& log) {
  std::string s;
  for (const Posted& p : log) s += p.kind + std::to_string(p.peer) + " ";
  return s;
}

TEST(GlooExchange, EveryReceiveIsPostedBeforeAnySendInRotation) {
  std::vector<at::Tensor> sends, recvs;
  for (int r = 0; r < 4; ++r) {
    sends.push_back(torch::zeros({3}));
    recvs.push_back(torch::zeros({3}));
  }
  // Rank 1 of 4: receives from 0, 3, 2 (rank-1, rank-2, ...), sends to 2, 3, 0.
  EXPECT_EQ(order(posted_by(1, sends, recvs)), "r0 r3 r2 s2 s3 s0 ");
  EXPECT_EQ(order(posted_by(0, sends, recvs)), "r3 r2 r1 s1 s2 s3 ");
}

TEST(GlooExchange, EmptyMessagesAndTheOwnEntryAreNotPosted) {
  std::vector<at::Tensor> sends{torch::zeros({2}), torch::zeros({0}), torch::zeros({5})};
  std::vector<at::Tensor> recvs{torch::zeros({0}), torch::zeros({4}), torch::zeros({4})};
  const auto log = posted_by(1, sends, recvs);
  EXPECT_EQ(order(log), "r2 s2 s0 ");
  EXPECT_EQ(log[1].numel, 5);
}

TEST(GlooExchange, OneRankPostsNothing) {
  EXPECT_TRUE(posted_by(0, {torch::zeros({2})}, {torch::zeros({2})}).empty());
}

}  // namespace gloo_exchange_test
