#include "comm/shm_allreduce.h"

#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <type_traits>
#include <vector>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <fmt/format.h>

#include "comm/peer_watch.h"

namespace deepspeed {
namespace comm {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// The type integer sums are done in, so that they wrap (as Gloo's do) without overflow UB.
template <typename Acc, bool = std::is_integral_v<Acc>>
struct WrapType {
  using type = Acc;
};
template <typename Acc>
struct WrapType<Acc, true> {
  using type = std::make_unsigned_t<Acc>;
};

// out[i] = op over ranks (in rank order) of rows[r][i], accumulated in Acc and rounded once, as
// Gloo does for the dtypes it converts (bf16 -> fp32 and back). Avg divides the sum by the world
// size in Acc for fp32/fp64/bf16 and integers (truncating), where the Gloo path divides its
// fp32/fp64/int staging tensor; fp16 is summed by Gloo in fp16, so its Avg rounds the sum to
// fp16 first and then divides (the same value for two ranks; for more, ours rounds only once).
// Blocks of kBlock elements: each block's accumulators are complete before `out` is written, so
// `out` may be one of the rows (a share reduced into the rank's own row), and the inner loops
// over one row vectorize; every element still sees the same operations in the same order.
// `half_avg_rounds_sum`: fp16 Avg as Gloo's all-reduce does it (above); false: as the
// reduce-scatter's local reduction does it (sum in fp32, divide, round once).
template <typename T, typename Acc>
void reduce_rows(T* out, const char* const* rows, int world, int64_t n, ReduceOp op,
                 bool half_avg_rounds_sum) {
  constexpr int64_t kBlock = 1024;
  Acc acc[kBlock];
  using U = typename WrapType<Acc>::type;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    const T* first = reinterpret_cast<const T*>(rows[0]) + b;
    for (int64_t i = 0; i < m; ++i) acc[i] = static_cast<Acc>(first[i]);
    for (int r = 1; r < world; ++r) {
      const T* x = reinterpret_cast<const T*>(rows[r]) + b;
      if (op == ReduceOp::Max) {
        for (int64_t i = 0; i < m; ++i) acc[i] = std::max(acc[i], static_cast<Acc>(x[i]));
      } else if (op == ReduceOp::Min) {
        for (int64_t i = 0; i < m; ++i) acc[i] = std::min(acc[i], static_cast<Acc>(x[i]));
      } else {
        for (int64_t i = 0; i < m; ++i)
          acc[i] = static_cast<Acc>(static_cast<U>(acc[i]) + static_cast<U>(static_cast<Acc>(x[i])));
      }
    }
    T* o = out + b;
    if (op != ReduceOp::Avg) {
      for (int64_t i = 0; i < m; ++i) o[i] = static_cast<T>(acc[i]);
    } else if (std::is_same_v<T, c10::Half> && half_avg_rounds_sum) {
      for (int64_t i = 0; i < m; ++i)
        o[i] = static_cast<T>(static_cast<float>(static_cast<T>(acc[i])) / static_cast<float>(world));
    } else {
      for (int64_t i = 0; i < m; ++i) o[i] = static_cast<T>(acc[i] / static_cast<Acc>(world));
    }
  }
}

// Reduces n elements of `type` from `rows` (each pointing at the first element) into `out`.
void reduce_into(at::ScalarType type, void* out, const char* const* rows, int world, int64_t n,
                 ReduceOp op, bool half_avg_rounds_sum = true) {
  switch (type) {
    case at::kFloat:
      return reduce_rows<float, float>(static_cast<float*>(out), rows, world, n, op, half_avg_rounds_sum);
    case at::kDouble:
      return reduce_rows<double, double>(static_cast<double*>(out), rows, world, n, op, half_avg_rounds_sum);
    case at::kHalf:
      return reduce_rows<c10::Half, float>(static_cast<c10::Half*>(out), rows, world, n, op, half_avg_rounds_sum);
    case at::kBFloat16:
      return reduce_rows<c10::BFloat16, float>(static_cast<c10::BFloat16*>(out), rows, world, n,
                                               op, half_avg_rounds_sum);
    case at::kInt:
      return reduce_rows<int32_t, int32_t>(static_cast<int32_t*>(out), rows, world, n, op, half_avg_rounds_sum);
    case at::kLong:
      return reduce_rows<int64_t, int64_t>(static_cast<int64_t*>(out), rows, world, n, op, half_avg_rounds_sum);
    default:
      throw CommError("shared-memory all_reduce: unexpected dtype");  // accepts() filters
  }
}

// After changing this rank's arrived or done: wakes the peers sleeping on it, if any. seq_cst on
// both sides (here: the counter, then waiters; the sleeper: waiters, then the counter) so that a
// sleeper either sees the new value before sleeping or is seen and woken.
void publish(ShmRankState& s) {
  s.futex.fetch_add(1);
  if (s.waiters.load() > 0)
    ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&s.futex), FUTEX_WAKE, INT32_MAX, nullptr,
              nullptr, 0);
}

bool reduced_here(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16 ||
         t == at::kInt || t == at::kLong;
}

// A process that has exited (a zombie not yet reaped by its parent counts as exited).
bool process_gone(int pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return false;
  const char state = line[close + 2];
  return state == 'Z' || state == 'X';
}

}  // namespace

// The handle: wait() finishes this operation (and any issued before it).
class ShmWork : public Work {
 public:
  ShmWork(std::shared_ptr<ShmAllReduce> group, uint64_t last_piece)
      : group_(std::move(group)), last_piece_(last_piece) {}
  void wait() override {
    std::lock_guard<std::mutex> lock(group_->mu_);
    group_->progress(last_piece_, /*block=*/true);
  }

 private:
  std::shared_ptr<ShmAllReduce> group_;
  uint64_t last_piece_;
};

std::shared_ptr<ShmAllReduce> ShmAllReduce::create(c10d::Store& store, int rank, int world,
                                                   std::chrono::milliseconds timeout,
                                                   const std::string& host) {
  const size_t max_bytes = shm_allreduce_max_bytes_from_env();
  const size_t max_gather_bytes = shm_allgather_max_bytes_from_env();
  const size_t slot_bytes = shm_allreduce_slot_bytes_from_env();
  const size_t share_bytes = shm_allreduce_share_bytes_from_env();
  // Ranks that disagree on any size would cut pieces differently: such a group keeps to Gloo.
  const std::string settings =
      fmt::format("max={} gather={} slot={} share={}", max_bytes, max_gather_bytes, slot_bytes,
                  share_bytes);
  auto seg = setup_shm_segment(store, rank, world, kSlots, slot_bytes, settings, host);
  if (!seg) return nullptr;
  return std::make_shared<ShmAllReduce>(std::move(seg), rank, world, max_bytes,
                                        max_gather_bytes, share_bytes, timeout);
}

ShmAllReduce::ShmAllReduce(std::unique_ptr<ShmSegment> seg, int rank, int world,
                           size_t max_bytes, size_t max_gather_bytes, size_t share_bytes,
                           std::chrono::milliseconds timeout)
    : seg_(std::move(seg)),
      rank_(rank),
      world_(world),
      max_bytes_(max_bytes),
      max_gather_bytes_(max_gather_bytes),
      slot_bytes_(seg_->header().slot_bytes),
      share_bytes_(share_bytes),
      timeout_(timeout) {}

ShmAllReduce::~ShmAllReduce() { seg_->rank_state(rank_).closed.store(1); }

bool ShmAllReduce::accepts(const at::Tensor& t) const {
  return t.device().is_cpu() && reduced_here(t.scalar_type()) &&
         static_cast<size_t>(t.numel()) * t.element_size() <= max_bytes_;
}

bool ShmAllReduce::accepts_gather(const at::Tensor& chunk) const {
  return chunk.device().is_cpu() &&
         static_cast<size_t>(chunk.numel()) * chunk.element_size() * world_ <= max_gather_bytes_;
}

ShmAllReduce::Pending ShmAllReduce::pending_for(const at::Tensor& input, ReduceOp op, OpDesc desc,
                                                std::function<void()> finish) {
  Pending p;
  p.start = Clock::now();
  p.tensor = input;
  p.dense = input.is_contiguous() ? input : input.contiguous();
  p.op = op;
  p.desc = std::move(desc);
  p.finish = std::move(finish);
  return p;
}

WorkPtr ShmAllReduce::all_reduce(at::Tensor& t, ReduceOp op, OpDesc desc,
                                 std::function<void()> finish) {
  return issue(pending_for(t, op, std::move(desc), std::move(finish)));
}

WorkPtr ShmAllReduce::reduce_scatter_v(at::Tensor& output, const at::Tensor& input,
                                       int64_t offset, ReduceOp op, OpDesc desc,
                                       std::function<void()> finish) {
  Pending p = pending_for(input, op, std::move(desc), std::move(finish));
  p.output = output;
  p.out = output.is_contiguous() ? output : at::empty_like(output, at::MemoryFormat::Contiguous);
  p.lo = offset;
  p.hi = offset + output.numel();
  return issue(std::move(p));
}

WorkPtr ShmAllReduce::all_gather(std::vector<at::Tensor> outputs, const at::Tensor& chunk,
                                 OpDesc desc, std::function<void()> finish) {
  Pending p = pending_for(chunk, ReduceOp::Sum, std::move(desc), std::move(finish));
  for (const at::Tensor& out : outputs)
    if (!out.is_contiguous() || out.numel() != chunk.numel() ||
        out.scalar_type() != chunk.scalar_type())
      throw CommError("shared-memory all_gather: each output must be contiguous, with the "
                      "input's dtype and size (internal error)");
  p.gathered = std::move(outputs);
  return issue(std::move(p));
}

bool ShmAllReduce::accepts_all_to_all(const at::Tensor& input) const {
  return input.device().is_cpu() &&
         static_cast<size_t>(input.numel()) * input.element_size() <= max_gather_bytes_;
}

WorkPtr ShmAllReduce::all_to_all(at::Tensor& output, const at::Tensor& input, OpDesc desc,
                                 std::function<void()> finish) {
  Pending p = pending_for(input, ReduceOp::Sum, std::move(desc), std::move(finish));
  p.output = output;
  // Staged when the output shares the input's storage: rows are read while later pieces of the
  // input are still to be published.
  const bool direct = output.is_contiguous() && !output.is_alias_of(input);
  p.out = direct ? output : at::empty_like(output, at::MemoryFormat::Contiguous);
  const int64_t chunk = input.numel() / world_;
  p.lo = rank_ * chunk;
  p.hi = p.lo + chunk;
  p.all_to_all = true;
  return issue(std::move(p));
}

WorkPtr ShmAllReduce::issue(Pending p) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!error_.empty()) throw CommError(error_);
  const int64_t per_piece = static_cast<int64_t>(slot_bytes_ / p.dense.element_size());
  const uint64_t pieces = static_cast<uint64_t>((p.dense.numel() + per_piece - 1) / per_piece);
  p.number = ++operations_;
  p.first = issued_ + 1;
  p.last = issued_ + pieces;
  pending_.push_back(std::move(p));
  issued_ += pieces;
  progress(0, /*block=*/false);  // publishes into free slots at once; never waits for the peers
  return std::make_shared<ShmWork>(shared_from_this(), issued_);
}

void ShmAllReduce::progress(uint64_t target, bool block) {
  for (;;) {
    if (block && read_ >= target) return;  // finished stays finished, even if a later one failed
    if (!error_.empty()) throw CommError(error_);
    // Publish ahead first (the peers may be waiting for it), then reduce, then finish.
    bool moved = false;
    while (published_ < issued_ && try_publish(false)) moved = true;
    while (reduced_ < published_ && try_reduce(false)) moved = true;
    while (read_ < reduced_ && try_finish(false)) moved = true;
    if (moved) continue;
    if (!block) return;
    // Nothing can move without the peers: wait at the earliest step piece read_ + 1 lacks.
    if (published_ == read_) {
      try_publish(true);
    } else if (reduced_ == read_) {
      try_reduce(true);
    } else {
      try_finish(true);
    }
  }
}

ShmAllReduce::Piece ShmAllReduce::piece(uint64_t seq) {
  for (Pending& op : pending_) {
    if (seq < op.first || seq > op.last) continue;
    const int64_t size = op.dense.element_size();
    const int64_t per_piece = static_cast<int64_t>(slot_bytes_) / size;
    const int64_t begin = static_cast<int64_t>(seq - op.first) * per_piece;
    const int64_t numel = std::min(per_piece, op.dense.numel() - begin);
    const bool shares = !op.out.defined() && op.gathered.empty() && world_ > 2 &&
                        static_cast<size_t>(numel * size) >= share_bytes_;
    return Piece{&op, static_cast<char*>(op.dense.data_ptr()) + begin * size, begin, numel,
                 shares};
  }
  throw CommError(fmt::format("shared-memory all_reduce: piece {} belongs to no pending "
                              "operation on rank {} (internal error)", seq, rank_));
}

std::pair<int64_t, int64_t> ShmAllReduce::share(const Piece& p, int r) const {
  // Whole cache lines per share, so that no two ranks write the same line of a row.
  const int64_t align = 64 / p.op->dense.element_size();
  const int64_t per_rank = ((p.numel + world_ - 1) / world_ + align - 1) / align * align;
  return {std::min(p.numel, r * per_rank), std::min(p.numel, (r + 1) * per_rank)};
}

bool ShmAllReduce::try_publish(bool block) {
  const uint64_t seq = published_ + 1;
  if (seq > kSlots) {
    // The slot of piece seq - kSlots is reused: this rank finishes it first, then every peer
    // must have finished it too.
    const uint64_t reuse = seq - kSlots;
    if (read_ < reuse) return false;
    if (!all_reached(Step::kDone, reuse)) {
      if (!block) return false;
      await_all(Step::kDone, reuse, seq);
    }
  }
  const Piece p = piece(seq);
  std::memcpy(seg_->slot(seq, rank_), p.data, p.numel * p.op->dense.element_size());
  seg_->rank_state(rank_).arrived.store(seq, std::memory_order_release);
  publish(seg_->rank_state(rank_));
  published_ = seq;
  return true;
}

bool ShmAllReduce::try_reduce(bool block) {
  const uint64_t seq = reduced_ + 1;
  const Piece p = piece(seq);
  if (p.shares) {
    if (!all_reached(Step::kArrived, seq)) {
      if (!block) return false;
      await_all(Step::kArrived, seq, seq);
    }
    const auto [begin, end] = share(p, rank_);
    const int64_t size = p.op->dense.element_size();
    std::vector<const char*> rows(world_);
    for (int r = 0; r < world_; ++r) rows[r] = seg_->slot(seq, r) + begin * size;
    if (end > begin)  // into this rank's own row: the peers read share r of row r when finishing
      reduce_into(p.op->dense.scalar_type(), const_cast<char*>(rows[rank_]), rows.data(), world_,
                  end - begin, p.op->op);
    seg_->rank_state(rank_).reduced.store(seq, std::memory_order_release);
    publish(seg_->rank_state(rank_));
  }
  reduced_ = seq;  // a small piece has no reduce step of its own
  return true;
}

bool ShmAllReduce::try_finish(bool block) {
  const uint64_t seq = read_ + 1;
  const Piece p = piece(seq);
  const Step need = p.shares ? Step::kReduced : Step::kArrived;
  if (!all_reached(need, seq)) {
    if (!block) return false;
    await_all(need, seq, seq);
  }
  const int64_t size = p.op->dense.element_size();
  if (!p.op->gathered.empty()) {  // all-gather: every row into its rank's output
    for (int r = 0; r < world_; ++r) {
      char* to = static_cast<char*>(p.op->gathered[r].data_ptr()) + p.begin * size;
      if (to != p.data) std::memcpy(to, seg_->slot(seq, r), p.numel * size);
    }
  } else if (p.op->all_to_all) {  // from every row the part inside chunk `rank`, into chunk r
    const int64_t begin = std::max(p.begin, p.op->lo);
    const int64_t end = std::min(p.begin + p.numel, p.op->hi);
    const int64_t chunk = p.op->hi - p.op->lo;
    char* out = static_cast<char*>(p.op->out.data_ptr());
    for (int r = 0; r < world_ && end > begin; ++r)
      std::memcpy(out + (r * chunk + begin - p.op->lo) * size,
                  seg_->slot(seq, r) + (begin - p.begin) * size, (end - begin) * size);
  } else if (p.op->out.defined()) {  // reduce-scatter: only the part inside this rank's segment
    const int64_t begin = std::max(p.begin, p.op->lo);
    const int64_t end = std::min(p.begin + p.numel, p.op->hi);
    if (end > begin) {
      std::vector<const char*> rows(world_);
      for (int r = 0; r < world_; ++r) rows[r] = seg_->slot(seq, r) + (begin - p.begin) * size;
      reduce_into(p.op->dense.scalar_type(),
                  static_cast<char*>(p.op->out.data_ptr()) + (begin - p.op->lo) * size,
                  rows.data(), world_, end - begin, p.op->op, /*half_avg_rounds_sum=*/false);
    }
  } else if (p.shares) {
    for (int r = 0; r < world_; ++r) {
      const auto [begin, end] = share(p, r);
      std::memcpy(p.data + begin * size, seg_->slot(seq, r) + begin * size, (end - begin) * size);
    }
  } else {
    std::vector<const char*> rows(world_);
    for (int r = 0; r < world_; ++r) rows[r] = seg_->slot(seq, r);
    reduce_into(p.op->dense.scalar_type(), p.data, rows.data(), world_, p.numel, p.op->op);
  }
  seg_->rank_state(rank_).done.store(seq, std::memory_order_release);
  publish(seg_->rank_state(rank_));
  read_ = seq;
  if (seq == p.op->last) {  // the operation is complete
    Pending& op = pending_.front();
    if (!op.gathered.empty()) {
      // nothing to write back: the outputs are contiguous, and the input is only read
    } else if (op.out.defined()) {
      if (!op.out.is_same(op.output)) op.output.copy_(op.out);
    } else if (!op.dense.is_same(op.tensor)) {
      op.tensor.copy_(op.dense);
    }
    std::function<void()> finish = std::move(op.finish);
    pending_.pop_front();
    if (finish) finish();
  }
  return true;
}

int ShmAllReduce::first_behind(Step step, uint64_t seq) const {
  for (int r = 0; r < world_; ++r) {
    const ShmRankState& s = seg_->rank_state(r);
    const std::atomic<uint64_t>& counter =
        step == Step::kArrived ? s.arrived : step == Step::kReduced ? s.reduced : s.done;
    if (counter.load(std::memory_order_acquire) < seq) return r;
  }
  return -1;
}

std::string ShmAllReduce::peer_gone(int peer) const {
  const ShmRankState& s = seg_->rank_state(peer);
  const int pid = s.pid.load();
  if (s.closed.load() != 0)
    return fmt::format("rank {} (pid {}) left the group: its communicator failed or was closed",
                       peer, pid);
  if (process_gone(pid)) return fmt::format("rank {} (pid {}) has exited", peer, pid);
  return "";
}

void ShmAllReduce::await_all(Step step, uint64_t seq, uint64_t seq_of_op) {
  // Spin ~2 us (a peer running on the other core arrives within that; longer spins cost
  // ~20 us a call whenever the two ranks share a core, measured), yield up to 200 us (a peer
  // waiting for this core gets it), then sleep on the late peer's futex, woken by its next
  // publish (as a socket read wakes Gloo) or after 1 ms, when liveness and the deadline are
  // checked.
  int behind = first_behind(step, seq);
  if (behind < 0) return;
  const Piece p = piece(seq_of_op);
  const Pending& op = *p.op;
  const uint64_t pieces = op.last - op.first + 1;
  const std::string what =
      pieces == 1 ? fmt::format("shared-memory {} #{}", op.desc.op, op.number)
                  : fmt::format("shared-memory {} #{} (piece {} of {})", op.desc.op, op.number,
                                seq_of_op - op.first + 1, pieces);
  // What the late rank has not done yet: before ... / did not ... in time.
  const char* ing = step == Step::kArrived   ? "contributing"
                    : step == Step::kReduced ? "reducing its share"
                                             : "reading an earlier piece (its slot is reused)";
  const char* inf = step == Step::kArrived   ? "contribute"
                    : step == Step::kReduced ? "reduce its share"
                                             : "read an earlier piece";
  const auto wait_start = Clock::now();
  const auto spin_end = wait_start + std::chrono::microseconds(2);
  const auto yield_end = wait_start + std::chrono::microseconds(200);
  auto next_check = wait_start + std::chrono::milliseconds(1);
  // After a slice, and then every 0.1 s: has a peer posted that it failed before issuing this
  // operation (failure_board.h)? Then it never will.
  auto next_board_check = wait_start + kFailureCheckSlice;
  for (int i = 0;; ++i) {
    behind = first_behind(step, seq);
    if (behind < 0) return;
    if ((i & 63) != 0) {
      cpu_relax();
      continue;
    }
    const auto now = Clock::now();
    if (now < spin_end) continue;
    if (now >= next_check) {
      next_check = now + std::chrono::milliseconds(1);
      std::string gone = peer_gone(behind);
      if (!gone.empty()) fail(op.desc, op.start, fmt::format("{}: {} before {}", what, gone, ing));
      // From this wait, not from issue: an operation may be waited on long after it was issued.
      if (now - wait_start > timeout_)
        fail(op.desc, op.start,
             fmt::format("{}: rank {} (pid {}) did not {} in time", what, behind,
                         seg_->rank_state(behind).pid.load(), inf));
      const OpPosition& pos = op.desc.position;
      if (pos.board && now >= next_board_check) {
        next_board_check = now + std::chrono::milliseconds(100);
        const std::string why = pos.board->why_stuck(pos);
        if (!why.empty()) fail(op.desc, op.start, fmt::format("{}: {}", what, why));
      }
    }
    if (now < yield_end) {
      ::sched_yield();
      continue;
    }
    ShmRankState& late = seg_->rank_state(behind);
    const uint32_t seen = late.futex.load();
    late.waiters.fetch_add(1);
    if (first_behind(step, seq) == behind) {
      const timespec ms{0, 1000 * 1000};
      ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&late.futex), FUTEX_WAIT, seen, &ms,
                nullptr, 0);
    }
    late.waiters.fetch_sub(1);
  }
}

void ShmAllReduce::fail(const OpDesc& desc, Clock::time_point start, const std::string& cause) {
  const std::chrono::duration<double> elapsed = Clock::now() - start;
  error_ = failure_message(desc, elapsed.count(), cause) + peer_watch_report();
  seg_->rank_state(rank_).closed.store(1);  // the peers waiting for this rank fail at once too
  throw CommError(error_);
}

}  // namespace comm
}  // namespace deepspeed
