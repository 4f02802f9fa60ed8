// What every Communicator implementation shares: identity, timeout, stats and argument checks.
#pragma once
#include <ATen/Tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/failure_board.h"
#include "comm/stats.h"
#include "comm/work.h"
#include "deepspeed/comm.h"

namespace deepspeed {
namespace comm {

class CommunicatorBase : public Communicator {
 public:
  CommunicatorBase(int rank, int world_size, int local_rank, std::chrono::milliseconds timeout)
      : rank_(rank), world_size_(world_size), local_rank_(local_rank), timeout_(timeout) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  int local_rank() const override { return local_rank_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  CommStats stats() const override { return stats_->snapshot(); }
  void reset_stats() override { stats_->reset(); }
  int64_t stats_resets() const override { return stats_->resets(); }
  void keep_latencies() override { stats_->keep_latencies(); }
  double total_ms(const std::string& op_prefix) const override {
    return stats_->total_ms(op_prefix);
  }

  // Numbers this communicator's operations on `board` (failure_board.h): its collectives on
  // channel `name`, its point-to-point messages on "<name>:<from>><to>". Every member passes the
  // same name. Called once, before the first operation.
  void watch_with(std::shared_ptr<FailureBoard> board, const std::string& name);
  const std::shared_ptr<FailureBoard>& failure_board() const { return board_; }
  // Where this communicator's next collective will stand (no board: an empty position).
  OpPosition next_position() const;
  // The recorder of this communicator's calls (stats.h), for the comms_logger's family walk.
  const std::shared_ptr<StatsRecorder>& recorder() const { return stats_; }

 protected:
  // Counts the call; `t` is the tensor whose bytes this rank contributes.
  void count(const char* op, const at::Tensor& t) {
    stats_->add(op, static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size()));
  }
  // REQUIRES of all_gather/reduce_scatter: big has world_size * small.numel() elements, same dtype.
  void check_split(const char* op, const at::Tensor& big, const at::Tensor& small) const;
  void check_peer(const char* op, int peer) const;

  // What a collective on `t` is, for failure messages (t undefined: a barrier).
  // Numbers the operation when watched: call it once per operation actually issued.
  OpDesc describe(const char* op, const at::Tensor& t) const;
  // The same for a send to (`sending`) or a receive from `peer`.
  OpDesc describe_p2p(const char* op, const at::Tensor& t, int peer, bool sending) const;
  // An operation described (numbered) whose start threw: never issued, so its number is taken
  // back (FailureBoard::withdraw). launch()/launch_all() and the shared-memory paths call it.
  static void withdraw(const OpDesc& d) {
    if (d.position.board) d.position.board->withdraw(d.position);
  }
  // Starts a c10d collective and wraps it in a Work whose wait() runs `finish`. A backend can
  // fail already at the start (Gloo: a pair closed by an earlier timeout); that reads like a
  // failure in wait(), as CommError naming the collective, and the operation is withdrawn.
  using Start = std::function<c10::intrusive_ptr<c10d::Work>()>;
  WorkPtr launch(OpDesc desc, const Start& start, std::function<void()> finish) const;
  // The same for a collective made of several c10d works, which `start` appends as it queues
  // them: one refused after others were queued is in part issued, which ends the job
  // (FailureBoard::end_job), where one refused whole is withdrawn.
  using StartAll = std::function<void(std::vector<c10::intrusive_ptr<c10d::Work>>& works)>;
  WorkPtr launch_all(OpDesc desc, const StartAll& start, std::function<void()> finish) const;
  // `finish` extended to record the collective's latency from `t0` (stats and the op observer),
  // as launch() does for its works; for collectives that are not c10d works (shared memory).
  std::function<void()> timed(const OpDesc& d, std::chrono::steady_clock::time_point t0,
                              std::function<void()> finish) const;
  // What split() returns: `sub` (a group split from this communicator, or nullptr) adopted into
  // this one's stats family (StatsRecorder::adopt): it keeps its calls' latencies whenever this
  // one does, so that keep_latencies() on a world reaches the groups split from it, whenever
  // they were split, and the comms_logger finds its calls.
  CommunicatorPtr sub_group(CommunicatorPtr sub) const;
  // A collective with nothing to move (zero elements): done at once on every rank.
  static WorkPtr done() { return std::make_shared<DoneWork>(); }

  const int rank_;
  const int world_size_;
  const int local_rank_;
  const std::chrono::milliseconds timeout_;
  // Shared with the Work handles, which record each collective's latency when it completes (a
  // handle may be waited on after the communicator is gone).
  std::shared_ptr<StatsRecorder> stats_ = std::make_shared<StatsRecorder>(world_size_);

 private:
  OpDesc describe_unnumbered(const char* op, const at::Tensor& t) const;

  std::shared_ptr<FailureBoard> board_;  // null: not watched
  int channel_ = -1;
  std::vector<int> sends_to_, receives_from_;  // channels by peer
};

// The recorder of the calls `comm` issues: a CommunicatorBase's own, through any desync checker
// (which records nothing itself); null for a communicator of neither kind (a test double).
std::shared_ptr<StatsRecorder> recorder_of(const Communicator& comm);

}  // namespace comm
}  // namespace deepspeed
