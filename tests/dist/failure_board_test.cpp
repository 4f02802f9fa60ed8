// The failure board (src/comm/failure_board.h) over two ranks as threads: a collective that a
// failed peer will never join fails as soon as the peer posts, naming the peer's error (not at
// the timeout); one it did issue is waited for; ranks that failed at the same operation go on;
// ranks that stopped at different ones are told the job cannot continue. On both paths of an
// all-reduce: Gloo (above the shared-memory limit) and shared memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <functional>
#include <future>
#include <thread>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include "comm/failure_board.h"
#include "comm/gloo_communicator.h"
#include "deepspeed/comm.h"
#include "support/expect.h"
#include "support/fake_communicator.h"
#include "support/ranks.h"

namespace failure_board_test {

namespace {

using deepspeed::CommError;
using deepspeed::comm::CommunicatorPtr;
using deepspeed::comm::failure_board_of;

// Long enough that a test passing on the timeout would say "Timed out", not the peer's error.
constexpr std::chrono::seconds kTimeout{60};
// "At once": a wait that a failed peer's post ends returns far sooner than kTimeout. One that
// ended only at the timeout (Gloo's "Timed out waiting ...", or a peer that gave up on its own
// timeout and closed its connections) runs kTimeout at least; the gap is wide so that a loaded
// machine cannot blur it.
constexpr double kAtOnceSeconds = 10;

// The CommError that `f` throws (a test failure when none) and how long `f` ran, in `seconds`.
std::string comm_error_of(const std::function<void()>& f, double& seconds) {
  const auto start = std::chrono::steady_clock::now();
  std::string message = dstest::message_of<CommError>(f);
  seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return message;
}

// Gloo writes "Timed out", c10d "timed out": either means the wait ran into the timeout.
bool says_timed_out(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text.find("timed out") != std::string::npos;
}

// Waits (bounded, so that a test bug fails instead of hanging) until `f` is ready: a failed rank
// holds its communicator open so that its peer's wait can end only through the board (a closed
// connection would end it too, however late the board told it).
void hold_until(std::shared_future<void> f) {
  EXPECT_EQ(f.wait_for(3 * kTimeout), std::future_status::ready) << "never released";
}

class FailureBoardPaths : public ::testing::TestWithParam<int64_t> {};

at::Tensor ones(int64_t numel) { return torch::ones({numel}); }

TEST_P(FailureBoardPaths, ACollectiveAFailedPeerDidNotIssueFailsNamingItsError) {
  const int64_t numel = GetParam();
  std::string waited, settled;
  double waited_s = 0;
  bool broken0 = false, broken1 = false;
  std::promise<void> rank0_failed;
  std::shared_future<void> rank0_has_failed = rank0_failed.get_future().share();
  run_ranks(
      2,
      [&](CommunicatorPtr comm) {
        auto board = failure_board_of(*comm);
        ASSERT_TRUE(board);
        at::Tensor t = ones(numel);
        comm->all_reduce(t)->wait();  // both ranks: operation 1 of the world group
        if (comm->rank() == 1) {
          board->post("backward", "injected failure in a hook");
          try {
            board->settle("step");
          } catch (const CommError& e) {
            settled = e.what();
          }
          broken1 = board->broken();
          hold_until(rank0_has_failed);
          return;
        }
        // Operation 2: rank 1 will never issue it.
        waited = comm_error_of([&] { comm->all_reduce(t)->wait(); }, waited_s);
        rank0_failed.set_value();
        board->post("backward", waited);  // what the engine does when the call fails
        broken0 = board->broken();
      },
      kTimeout);
  EXPECT_CONTAINS(waited, "rank 1's backward failed (injected failure in a hook)");
  EXPECT_CONTAINS(waited, "after it had issued 1 operation on the world group, and this one is "
                          "number 2 there");
  EXPECT_FALSE(says_timed_out(waited)) << waited;
  EXPECT_LT(waited_s, kAtOnceSeconds) << "timeout " << kTimeout.count() << " s: " << waited;
  // Rank 0's wait told everyone at once (its ending key), before its own post.
  EXPECT_CONTAINS(settled, "step on rank 1 of 2: rank 0 found that the job cannot continue: "
                           "rank 1's backward failed (injected failure in a hook)");
  EXPECT_TRUE(broken0);
  EXPECT_TRUE(broken1);
}

TEST_P(FailureBoardPaths, ACollectiveTheFailedPeerIssuedIsWaitedFor) {
  const int64_t numel = GetParam();
  std::vector<float> sums(2);
  run_ranks(
      2,
      [&](CommunicatorPtr comm) {
        auto board = failure_board_of(*comm);
        at::Tensor t = ones(numel);
        auto work = comm->all_reduce(t);
        if (comm->rank() == 1) {
          board->post("backward", "failed after launching its bucket");
          // Rank 0's wait outlasts a few slices, reading the post each time.
          std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        }
        work->wait();
        sums[comm->rank()] = t[numel - 1].item<float>();
        EXPECT_FALSE(board->broken());
      },
      kTimeout);
  EXPECT_EQ(sums[0], 2.0f);
  EXPECT_EQ(sums[1], 2.0f);
}

TEST_P(FailureBoardPaths, ASlowPeerIsWaitedForAcrossSlices) {
  const int64_t numel = GetParam();
  std::vector<float> sums(2);
  run_ranks(
      2,
      [&](CommunicatorPtr comm) {
        if (comm->rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1300));
        at::Tensor t = torch::arange(numel, torch::kFloat);
        comm->all_reduce(t)->wait();
        sums[comm->rank()] = t[numel - 1].item<float>();
      },
      kTimeout);
  EXPECT_EQ(sums[0], 2.0f * static_cast<float>(numel - 1));
  EXPECT_EQ(sums[1], sums[0]);
}

TEST_P(FailureBoardPaths, RanksThatFailedAtTheSameOperationGoOn) {
  const int64_t numel = GetParam();
  std::vector<float> sums(2);
  run_ranks(
      2,
      [&](CommunicatorPtr comm) {
        auto board = failure_board_of(*comm);
        at::Tensor t = ones(numel);
        comm->all_reduce(t)->wait();
        board->post("backward", "out of memory on every rank");
        board->settle("backward");  // returns: both stopped after operation 1
        EXPECT_FALSE(board->broken());
        at::Tensor again = ones(numel);
        comm->all_reduce(again)->wait();
        sums[comm->rank()] = again[0].item<float>();
        board->settle("step");  // nothing unsettled: at once
      },
      kTimeout);
  EXPECT_EQ(sums[0], 2.0f);
  EXPECT_EQ(sums[1], 2.0f);
}

// Every rank fails at the same point; rank 0 settles, retries (launching a collective it does
// not wait for, as a bucket) and fails again before rank 1 has even settled the first round.
// Each round is compared with the same round of the others, so both go on.
TEST_P(FailureBoardPaths, AFastRankFailingTwiceIsComparedRoundByRound) {
  const int64_t numel = GetParam();
  std::vector<float> sums(2);
  run_ranks(
      2,
      [&](CommunicatorPtr comm) {
        auto board = failure_board_of(*comm);
        at::Tensor t = ones(numel);
        comm->all_reduce(t)->wait();
        board->post("backward", "out of memory");
        at::Tensor bucket = ones(numel);
        deepspeed::comm::WorkPtr launched;
        if (comm->rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
        board->settle("backward");  // rank 1: round 1 against rank 0's first post, not its second
        launched = comm->all_reduce(bucket);
        board->post("backward", "out of memory again");
        board->settle("backward");  // round 2
        launched->wait();
        at::Tensor again = ones(numel);
        comm->all_reduce(again)->wait();
        sums[comm->rank()] = again[0].item<float>();
        EXPECT_FALSE(board->broken());
      },
      kTimeout);
  EXPECT_EQ(sums[0], 2.0f);
  EXPECT_EQ(sums[1], 2.0f);
}

// 16 floats: shared memory; 2^19 floats (2 MiB): over the 1 MiB limit, through Gloo.
INSTANTIATE_TEST_SUITE_P(Paths, FailureBoardPaths, ::testing::Values(16, 1 << 19),
                         [](const auto& info) {
                           return info.param == 16 ? std::string("shared_memory")
                                                   : std::string("gloo");
                         });

TEST(FailureBoard, ASubGroupsCollectiveNamesTheSubGroup) {
  std::string waited;
  double waited_s = 0;
  run_ranks(
      2,
      [&](CommunicatorPtr comm) {
        auto group = comm->split(0, comm->rank());
        auto board = failure_board_of(*group);
        ASSERT_EQ(board, failure_board_of(*comm)) << "one board per job";
        if (comm->rank() == 1) {
          board->post("forward", "injected");
          // Kept until rank 0 has posted too: a group closed now would fail rank 0's wait with
          // "connection closed" first.
          EXPECT_THROW(board->settle("forward"), CommError);
          return;
        }
        at::Tensor t = ones(1 << 19);
        waited = comm_error_of([&] { group->all_reduce(t)->wait(); }, waited_s);
        board->post("forward", waited);
      },
      kTimeout);
  EXPECT_CONTAINS(waited, "rank 1's forward failed (injected) after it had issued 0 operations on "
                          "sub-group w/split0/0");
  EXPECT_FALSE(says_timed_out(waited)) << waited;
  EXPECT_LT(waited_s, kAtOnceSeconds) << "timeout " << kTimeout.count() << " s: " << waited;
}

// With the desync checker (comms_check) on, a rank waits for its peers' description of the next
// collective before issuing it: a failed peer's post ends that wait too, not the timeout.
TEST(FailureBoard, TheDesyncCheckersWaitEndsOnAPeersFailure) {
  std::string waited;
  double waited_s = 0;
  run_ranks(
      2,
      [&](CommunicatorPtr plain) {
        auto comm = deepspeed::comm::with_comms_check(plain);
        auto board = failure_board_of(*comm);
        ASSERT_EQ(board, failure_board_of(*plain)) << "seen through the checker";
        at::Tensor t = ones(16);
        comm->all_reduce(t)->wait();
        if (comm->rank() == 1) {
          board->post("backward", "injected");
          EXPECT_THROW(board->settle("backward"), CommError);  // kept until rank 0 has posted
          return;
        }
        waited = comm_error_of([&] { comm->all_reduce(t)->wait(); }, waited_s);
        board->post("backward", waited);
      },
      kTimeout);
  EXPECT_CONTAINS(waited, "comms_check on rank 0 of 2: rank 0 issued all_reduce");
  EXPECT_FALSE(says_timed_out(waited)) << waited;
  EXPECT_LT(waited_s, kAtOnceSeconds) << "timeout " << kTimeout.count() << " s: " << waited;
  EXPECT_CONTAINS(waited, "rank 1's backward failed (injected) after it had issued 1 operation");
}

// Point-to-point messages are numbered too (not watched: Gloo's send and receive works end for
// good when a timed wait runs out): a message sent but never received parts the ranks.
TEST(FailureBoard, AMessageSentButNotReceivedPartsTheRanks) {
  std::vector<std::string> settled(2);
  run_ranks(
      2,
      [&](CommunicatorPtr comm) {
        auto board = failure_board_of(*comm);
        at::Tensor t = ones(4);
        if (comm->rank() == 0) comm->send(t, 1);  // not waited for: rank 1 never receives it
        board->post("train_batch", "injected");
        try {
          board->settle("train_batch");
        } catch (const CommError& e) {
          settled[comm->rank()] = e.what();
        }
      },
      kTimeout);
  for (int r = 0; r < 2; ++r)
    EXPECT_CONTAINS(settled[r], "on rank 0's messages to rank 1, rank 0 had issued 1 operation "
                                "and rank 1 0");
}

// The watcher thread of blocking waits ends once it has had nothing to watch for a while (it
// woke every 0.25 s for as long as the board lived), and the next blocking wait starts it again.
TEST(FailureBoard, TheWatcherThreadEndsWhenIdleAndComesBack) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto board = std::make_shared<deepspeed::comm::FailureBoard>(store, 0, 2, kTimeout);
  auto watch_once = [&] {
    auto work = c10::make_intrusive<c10d::Work>();
    board->unwatch(board->watch(work, board->peek(board->channel("w"))));
  };
  watch_once();
  EXPECT_TRUE(board->watcher_running());
  const auto deadline = std::chrono::steady_clock::now() + kTimeout;
  while (board->watcher_running() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(board->watcher_running()) << "still running after " << kTimeout.count() << " s";
  watch_once();
  EXPECT_TRUE(board->watcher_running());
}

// A communicator whose next operation fails to start (Gloo refuses to queue it: its pair
// closed by an earlier timeout), numbered on a board as the Gloo communicator numbers its own.
class FailingToStart : public dstest::FakeCommunicator {
 public:
  FailingToStart(int rank, std::shared_ptr<deepspeed::comm::FailureBoard> board)
      : FakeCommunicator(rank, 2) {
    watch_with(std::move(board), "w");
  }
  deepspeed::comm::WorkPtr all_reduce_that_fails_to_start(const at::Tensor& t) {
    return launch(
        describe("all_reduce", t),
        []() -> c10::intrusive_ptr<c10d::Work> { throw std::runtime_error("pair closed"); },
        nullptr);
  }
  // An all-gather of broadcasts whose second one is refused after the first was queued.
  deepspeed::comm::WorkPtr all_gather_that_fails_halfway(const at::Tensor& t) {
    auto start = [](std::vector<c10::intrusive_ptr<c10d::Work>>& works) {
      works.push_back(c10::make_intrusive<c10d::Work>());
      throw std::runtime_error("pair closed");
    };
    return launch_all(describe("all_gather", t), start, nullptr);
  }
};

// Two ranks' boards over one in-process store, without communicators: rank 1 fails to start
// an operation (FailingToStart), rank 0 asks why its own next operation on "w" is stuck.
struct TwoBoards {
  c10::intrusive_ptr<c10d::HashStore> store = c10::make_intrusive<c10d::HashStore>();
  std::shared_ptr<deepspeed::comm::FailureBoard> board0 =
      std::make_shared<deepspeed::comm::FailureBoard>(store, 0, 2, kTimeout);
  std::shared_ptr<deepspeed::comm::FailureBoard> board1 =
      std::make_shared<deepspeed::comm::FailureBoard>(store, 1, 2, kTimeout);
  FailingToStart rank1{1, board1};
  std::string why_rank0_is_stuck() {
    auto waiting = board0->issue(board0->channel("w"));
    waiting.board = board0;
    return board0->why_stuck(waiting);
  }
};

// An operation numbered and then refused at its start was never issued: its number is taken
// back, so the rank's post shows that it stopped before it, and a peer waiting in it fails at
// once. Before, it counted as issued, and the peer waited until the timeout.
TEST(FailureBoard, AnOperationThatFailedToStartIsNotCountedAsIssued) {
  TwoBoards ranks;
  auto& board1 = ranks.board1;
  EXPECT_THROW(ranks.rank1.all_reduce_that_fails_to_start(ones(4)), CommError);
  EXPECT_EQ(board1->peek(board1->channel("w")).index, 0u) << "its number was taken back";
  EXPECT_EQ(board1->numbered_total(), 1u) << "the call tried: it has a failure to post";
  board1->post("backward", "injected");
  EXPECT_CONTAINS(ranks.why_rank0_is_stuck(),  // rank 0's all-reduce, number 1
                  "rank 1's backward failed (injected) after it had issued 0 operations");

  // Taken back only while it is the channel's last number.
  const int w = board1->channel("w");
  auto first = board1->issue(w);
  board1->issue(w);
  board1->withdraw(first);
  EXPECT_EQ(board1->peek(w).index, 2u);
}

// One refused after part of it was queued cannot be taken back (its ranks' Gloo sequences no
// longer match): the job ends, and a peer's wait says why at once.
TEST(FailureBoard, AnOperationQueuedInPartEndsTheJob) {
  TwoBoards ranks;
  auto& board1 = ranks.board1;
  EXPECT_THROW(ranks.rank1.all_gather_that_fails_halfway(ones(4)), CommError);
  EXPECT_TRUE(board1->broken());
  EXPECT_EQ(board1->peek(board1->channel("w")).index, 1u) << "it stays counted";
  EXPECT_CONTAINS(ranks.why_rank0_is_stuck(),
                  "rank 1 found that the job cannot continue: its all_gather (member 1 of 2 of its "
                  "group) was queued in part (1 of its works) when the next one was refused "
                  "(pair closed)");
  EXPECT_THROW(board1->settle("forward"), CommError);
}

}  // namespace

}  // namespace failure_board_test
