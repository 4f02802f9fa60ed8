// All-reduce through shared memory for a group whose ranks are all on this host (DeepSpeed's CPU
// `shm` all-reduce, which its inference uses for the tensor-parallel all-reduces). A [1, 1024]
// fp32 row over Gloo's TCP loopback costs ~1.7 ms per call on this machine; here it is a copy in,
// one wait for the peers and a local reduce (docs/benchmarks.md, "Shared-memory all-reduce").
//
// Protocol, operation n of this group (n = 1, 2, ...; every rank issues them in the same order):
//   issue:  wait until every rank is done reading operation n - slots (its slot is reused), copy
//           the tensor into this rank's row of slot n % slots, publish arrived = n.
//   wait(): wait until every rank has arrived at n, reduce all rows of slot n in rank order into
//           the tensor, publish done = n.
// Issue does not wait for the peers' data, so a handle can be waited on later (ZeRO's buckets
// are issued before any is waited on) and a rank may send/recv between issue and wait, as with
// Gloo; only more than `slots` operations outstanding make issue wait. Every rank reduces in the
// same order, so all ranks hold bit-identical results. Waits spin ~2 us, yield up to 200 us,
// then sleep on the late peer's futex until it publishes (two cores may carry four ranks: a
// spinning rank must not starve the one it waits for).
//
// Failure: a peer that exits (pid gone), closes its communicator or fails, or does not arrive
// within the communicator's timeout, fails the operation with CommError naming the operation,
// this rank, the peer and what it saw, plus the peer watch's report, like a failed Gloo
// collective; the group is then broken (later operations fail at once, as Gloo closes its pairs
// after a timeout) and tells its peers so, so they fail at once too.
//
// Thread-safety: issue and wait may come from several threads; one mutex orders them.
#pragma once
#include <ATen/Tensor.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "comm/shm_segment.h"
#include "comm/work.h"
#include "deepspeed/comm.h"

namespace deepspeed {
namespace comm {

class ShmAllReduce : public std::enable_shared_from_this<ShmAllReduce> {
 public:
  static constexpr int kSlots = 4;

  // The group's shared-memory all-reduce, or null when the group cannot use one (see
  // setup_shm_segment). COLLECTIVE over the group.
  static std::shared_ptr<ShmAllReduce> create(c10d::Store& store, int rank, int world,
                                              std::chrono::milliseconds timeout);
  ShmAllReduce(std::unique_ptr<ShmSegment> seg, int rank, int world, size_t max_bytes,
               std::chrono::milliseconds timeout);
  ~ShmAllReduce();  // tells the peers this rank is gone

  // Whether this path takes `t`: a CPU tensor of a dtype reduced here (fp32, fp64, fp16, bf16,
  // int32, int64) of at most max_bytes. Others keep to Gloo.
  bool accepts(const at::Tensor& t) const;
  size_t max_bytes() const { return max_bytes_; }

  // Issues the all-reduce of `t` in place (REQUIRES accepts(t), t.numel() > 0). `finish` runs
  // once, after the result is in `t` (latency statistics).
  WorkPtr all_reduce(at::Tensor& t, ReduceOp op, OpDesc desc, std::function<void()> finish);

 private:
  using Clock = std::chrono::steady_clock;
  struct Pending {
    uint64_t seq;
    at::Tensor tensor;
    ReduceOp op;
    OpDesc desc;
    std::function<void()> finish;
    Clock::time_point start;
  };
  friend class ShmWork;

  // Completes (reads) every issued operation up to `seq`; throws the group's failure.
  void complete(uint64_t seq);
  void read_one(Pending& p);
  // Spins, yields, then sleeps until every rank's counter (arrived or done) reaches `seq`. On a
  // dead, closed or late peer: breaks the group and throws CommError for `desc`.
  void await_all(bool arrived, uint64_t seq, const OpDesc& desc, Clock::time_point start);
  // The first rank whose counter is below `seq`, or -1.
  int first_behind(bool arrived, uint64_t seq) const;
  // Why `peer` is behind, if it can no longer catch up: "" while it may still.
  std::string peer_gone(int peer) const;
  [[noreturn]] void fail(const OpDesc& desc, Clock::time_point start, const std::string& cause);

  std::unique_ptr<ShmSegment> seg_;
  const int rank_, world_;
  const size_t max_bytes_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  uint64_t issued_ = 0;  // seq of the last operation issued here
  uint64_t read_ = 0;    // seq of the last operation read here
  std::deque<Pending> pending_;
  std::string error_;  // the first failure; later operations rethrow it
};

}  // namespace comm
}  // namespace deepspeed
