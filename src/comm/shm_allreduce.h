// All-reduce through shared memory for a group whose ranks are all on this host (DeepSpeed's CPU
// `shm` all-reduce, which its inference uses for the tensor-parallel all-reduces). A [1, 1024]
// fp32 row over Gloo's TCP loopback costs ~1.7 ms per call on this machine; here it is a copy in,
// one wait for the peers and a local reduce (docs/benchmarks.md, "Shared-memory all-reduce").
//
// The same machinery serves reduce_scatter_v (below): pieces are published alike, and a rank
// finishes a piece by reducing only the part inside its own segment; and all_gather: each rank
// publishes pieces of its own chunk, and finishes a piece by copying every row into the output of
// the rank that wrote it (no reduction); and all_to_all: each rank publishes its whole input and
// finishes a piece by copying, from every row, the part addressed to it.
//
// Vocabulary: a **piece** is at most one slot row (slot_bytes, 1 MiB by default) of an
// all-reduce; an all-reduce of B bytes is ceil(B / slot_bytes) pieces, numbered by `seq` (1, 2,
// ... over the group's life; every rank issues the same all-reduces in the same order, so pieces
// agree). Piece seq lives in slot seq % slots, one row per rank. A piece's **shares** are world
// contiguous, cache-line-aligned ranges of it, share r belonging to rank r.
//
// Each piece goes through three steps on every rank, each published in the rank's counter:
//   publish (arrived = seq): when every rank is done with piece seq - slots (its slot is
//           reused), copy this rank's part of the tensor into its row.
//   reduce  (reduced = seq; only pieces of at least share_bytes, and more than 2 ranks: with 2,
//           each rank reads two rows' worth either way, measured no faster): when all arrived,
//           reduce share `rank` of every row, in rank order, into share `rank` of this rank's
//           own row (each rank reads 1/world of every row instead of all of it).
//   finish  (done = seq): small piece: when every rank has arrived, reduce all rows in rank order
//           into the tensor; large piece: when every rank has reduced, copy share r from row r.
// Either way each element is reduced by one sequence of operations in rank order, so every rank
// holds the same bits (and the same bits as the other method). Issue never waits for the peers:
// it takes whatever steps are possible at once (publishes into free slots, reduces what has
// arrived) and wait() takes the rest, blocking; so handles can be waited on late and in any
// order (ZeRO's buckets are all issued before any is waited on) and a rank may send/recv
// between issue and wait, as with Gloo. One difference from Gloo's background thread: a piece
// moves only while some call into this group runs, so once more than `slots` pieces are
// outstanding (an operation over 4 MiB, or several), a rank's wait() needs its peers to call in
// too (issue or wait); a peer blocked first in another collective that this rank issues only
// after its wait() would hang both until the timeout fails them. Ranks running the same program
// wait in the same order, as ZeRO and the engines do. Waits spin ~2 us, yield up to 200 us, then
// sleep on the late peer's futex until it publishes (two cores may carry four ranks: a spinning
// rank must not starve the one it waits for).
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
#include <utility>

#include "comm/shm_segment.h"
#include "comm/work.h"
#include "deepspeed/comm.h"

namespace deepspeed {
namespace comm {

class ShmAllReduce : public std::enable_shared_from_this<ShmAllReduce> {
 public:
  static constexpr int kSlots = 4;

  // The group's shared-memory all-reduce, or null when the group cannot use one (see
  // setup_shm_segment; `host` as there). COLLECTIVE over the group.
  static std::shared_ptr<ShmAllReduce> create(c10d::Store& store, int rank, int world,
                                              std::chrono::milliseconds timeout,
                                              const std::string& host);
  ShmAllReduce(std::unique_ptr<ShmSegment> seg, int rank, int world, size_t max_bytes,
               size_t max_gather_bytes, size_t share_bytes, std::chrono::milliseconds timeout);
  ~ShmAllReduce();  // tells the peers this rank is gone

  // Whether this path takes `t`: a CPU tensor of a dtype reduced here (fp32, fp64, fp16, bf16,
  // int32, int64) of at most max_bytes. Others keep to Gloo.
  bool accepts(const at::Tensor& t) const;
  size_t max_bytes() const { return max_bytes_; }
  size_t slot_bytes() const { return slot_bytes_; }

  // Issues the all-reduce of `t` in place (REQUIRES accepts(t), t.numel() > 0). `finish` runs
  // once, after the result is in `t` (latency statistics).
  WorkPtr all_reduce(at::Tensor& t, ReduceOp op, OpDesc desc, std::function<void()> finish);

  // Issues the uneven reduce-scatter of `input` (REQUIRES accepts(input), input.numel() > 0,
  // output of input's dtype, on the CPU): this rank's `output` receives the reduction of
  // input[offset, offset + output.numel()) over the ranks. The same pieces as an all-reduce, but
  // a rank finishes a piece by reducing only the part inside its segment (no shares). Sum and Avg
  // of fp16/bf16 accumulate in fp32 and round once, as the Gloo path's local reduction does.
  WorkPtr reduce_scatter_v(at::Tensor& output, const at::Tensor& input, int64_t offset,
                           ReduceOp op, OpDesc desc, std::function<void()> finish);

  // Whether this path takes the all-gather of `chunk` (this rank's part; every rank's of the same
  // size): a CPU tensor of any dtype (moved as bytes) whose gathered whole, world x chunk, is at
  // most max_gather_bytes.
  bool accepts_gather(const at::Tensor& chunk) const;
  size_t max_gather_bytes() const { return max_gather_bytes_; }

  // Issues the all-gather of `chunk` (REQUIRES accepts_gather(chunk), chunk.numel() > 0):
  // outputs[r] (contiguous, chunk's dtype and numel; outputs[rank] may be chunk itself) receives
  // rank r's chunk. The same pieces as an all-reduce of the chunk; finishing a piece copies every
  // peer's row into its output.
  WorkPtr all_gather(std::vector<at::Tensor> outputs, const at::Tensor& chunk, OpDesc desc,
                     std::function<void()> finish);

  // Whether this path takes the all-to-all of `input`: a CPU tensor of any dtype of at most
  // max_gather_bytes (an all-to-all only moves bytes, as an all-gather does).
  bool accepts_all_to_all(const at::Tensor& input) const;

  // Issues the all-to-all of `input` (REQUIRES accepts_all_to_all(input), input.numel() > 0,
  // a multiple of the world size; output on the CPU, input's dtype and size): chunk r of
  // `output` receives chunk `rank` of rank r's input. The same pieces as an all-reduce of the
  // input; finishing a piece copies, from every row, the part inside chunk `rank`.
  WorkPtr all_to_all(at::Tensor& output, const at::Tensor& input, OpDesc desc,
                     std::function<void()> finish);

 private:
  using Clock = std::chrono::steady_clock;
  enum class Step { kArrived, kReduced, kDone };  // which counter of ShmRankState
  struct Pending {
    uint64_t number;       // this group's all-reduce count (1, 2, ...), for messages
    uint64_t first, last;  // its pieces' seqs
    at::Tensor tensor;     // the caller's
    at::Tensor dense;      // contiguous: the tensor itself, or a staged copy written back at the end
    ReduceOp op;
    OpDesc desc;
    std::function<void()> finish;
    Clock::time_point start;
    // Reduce-scatter only (`out` defined): this rank's segment [lo, hi) of the input, reduced into
    // `out` (contiguous: the output itself, or a staged copy written back at the end).
    at::Tensor output, out;
    int64_t lo = 0, hi = 0;
    // All-gather only (non-empty): rank r's chunk goes into gathered[r]; `dense` is this rank's.
    std::vector<at::Tensor> gathered;
    // All-to-all: `output`/`out` as for a reduce-scatter, [lo, hi) chunk `rank` of every row;
    // row r's part of it goes into chunk r of `out`.
    bool all_to_all = false;
  };
  // A pending operation on `input` with the fields every kind sets (reduce_scatter_v adds its
  // output and segment).
  Pending pending_for(const at::Tensor& input, ReduceOp op, OpDesc desc,
                      std::function<void()> finish);
  // Queues an operation of ceil(bytes / slot) pieces and takes the steps possible at once.
  WorkPtr issue(Pending op);
  struct Piece {
    Pending* op;
    char* data;  // in op->dense
    int64_t begin;  // its first element in op->dense
    int64_t numel;
    bool shares;  // reduced in shares (at least share_bytes, more than 2 ranks)
  };
  friend class ShmWork;

  // Takes every step it can; with `block`, until piece `target` is finished here (waiting for the
  // peers where needed). Throws the group's failure.
  void progress(uint64_t target, bool block);
  // One step for the next piece that needs it; false when the peers are not ready and !block.
  bool try_publish(bool block);
  bool try_reduce(bool block);
  bool try_finish(bool block);
  Piece piece(uint64_t seq);
  // [begin, end) elements of share r of a piece.
  std::pair<int64_t, int64_t> share(const Piece& p, int r) const;
  bool all_reached(Step step, uint64_t seq) const { return first_behind(step, seq) < 0; }
  // Spins, yields, then sleeps until every rank's counter reaches `seq`. On a dead, closed or
  // late peer: breaks the group and throws CommError for the operation of piece `seq_of_op`.
  void await_all(Step step, uint64_t seq, uint64_t seq_of_op);
  // The first rank whose counter is below `seq`, or -1.
  int first_behind(Step step, uint64_t seq) const;
  // Why `peer` is behind, if it can no longer catch up: "" while it may still.
  std::string peer_gone(int peer) const;
  [[noreturn]] void fail(const OpDesc& desc, Clock::time_point start, const std::string& cause);

  std::unique_ptr<ShmSegment> seg_;
  const int rank_, world_;
  const size_t max_bytes_, max_gather_bytes_, slot_bytes_, share_bytes_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  uint64_t operations_ = 0;  // operations issued here (all-reduces, reduce-scatters, gathers)
  // Pieces: issued >= published >= reduced >= read (finished) here.
  uint64_t issued_ = 0, published_ = 0, reduced_ = 0, read_ = 0;
  std::deque<Pending> pending_;  // issued, not finished
  std::string error_;  // the first failure; later operations rethrow it
};

}  // namespace comm
}  // namespace deepspeed
