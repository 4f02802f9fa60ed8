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

// out[i] = op over ranks (in rank order) of rows[r][i], accumulated in Acc and rounded once, as
// Gloo does for the dtypes it converts (bf16 -> fp32 and back). Avg divides the sum by the world
// size in Acc for fp32/fp64/bf16 and integers (truncating), where the Gloo path divides its
// fp32/fp64/int staging tensor; fp16 is summed by Gloo in fp16, so its Avg rounds the sum to
// fp16 first and then divides (the same value for two ranks; for more, ours rounds only once).
template <typename T, typename Acc>
void reduce_rows(T* out, const char* const* rows, int world, int64_t n, ReduceOp op) {
  auto row = [&](int r) { return reinterpret_cast<const T*>(rows[r]); };
  for (int64_t i = 0; i < n; ++i) {
    Acc acc = static_cast<Acc>(row(0)[i]);
    for (int r = 1; r < world; ++r) {
      const Acc x = static_cast<Acc>(row(r)[i]);
      if (op == ReduceOp::Max) {
        acc = std::max(acc, x);
      } else if (op == ReduceOp::Min) {
        acc = std::min(acc, x);
      } else if constexpr (std::is_integral_v<Acc>) {  // wraps, as Gloo's does
        acc = static_cast<Acc>(static_cast<std::make_unsigned_t<Acc>>(acc) +
                               static_cast<std::make_unsigned_t<Acc>>(x));
      } else {
        acc += x;
      }
    }
    if (op == ReduceOp::Avg) {
      if constexpr (std::is_same_v<T, c10::Half>) {
        out[i] = static_cast<T>(static_cast<float>(static_cast<T>(acc)) / static_cast<float>(world));
        continue;
      } else {
        acc = acc / static_cast<Acc>(world);
      }
    }
    out[i] = static_cast<T>(acc);
  }
}

void reduce_into(at::Tensor& out, const char* const* rows, int world, ReduceOp op) {
  const int64_t n = out.numel();
  void* p = out.data_ptr();
  switch (out.scalar_type()) {
    case at::kFloat:
      return reduce_rows<float, float>(static_cast<float*>(p), rows, world, n, op);
    case at::kDouble:
      return reduce_rows<double, double>(static_cast<double*>(p), rows, world, n, op);
    case at::kHalf:
      return reduce_rows<c10::Half, float>(static_cast<c10::Half*>(p), rows, world, n, op);
    case at::kBFloat16:
      return reduce_rows<c10::BFloat16, float>(static_cast<c10::BFloat16*>(p), rows, world, n, op);
    case at::kInt:
      return reduce_rows<int32_t, int32_t>(static_cast<int32_t*>(p), rows, world, n, op);
    case at::kLong:
      return reduce_rows<int64_t, int64_t>(static_cast<int64_t*>(p), rows, world, n, op);
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

// The handle: wait() completes this operation (and any issued before it).
class ShmWork : public Work {
 public:
  ShmWork(std::shared_ptr<ShmAllReduce> group, uint64_t seq)
      : group_(std::move(group)), seq_(seq) {}
  void wait() override { group_->complete(seq_); }

 private:
  std::shared_ptr<ShmAllReduce> group_;
  uint64_t seq_;
};

std::shared_ptr<ShmAllReduce> ShmAllReduce::create(c10d::Store& store, int rank, int world,
                                                   std::chrono::milliseconds timeout) {
  const size_t max_bytes = shm_allreduce_max_bytes_from_env();
  auto seg = setup_shm_segment(store, rank, world, kSlots, max_bytes);
  if (!seg) return nullptr;
  return std::make_shared<ShmAllReduce>(std::move(seg), rank, world, max_bytes, timeout);
}

ShmAllReduce::ShmAllReduce(std::unique_ptr<ShmSegment> seg, int rank, int world,
                           size_t max_bytes, std::chrono::milliseconds timeout)
    : seg_(std::move(seg)), rank_(rank), world_(world), max_bytes_(max_bytes), timeout_(timeout) {}

ShmAllReduce::~ShmAllReduce() { seg_->rank_state(rank_).closed.store(1); }

bool ShmAllReduce::accepts(const at::Tensor& t) const {
  return t.device().is_cpu() && reduced_here(t.scalar_type()) &&
         static_cast<size_t>(t.numel()) * t.element_size() <= max_bytes_;
}

WorkPtr ShmAllReduce::all_reduce(at::Tensor& t, ReduceOp op, OpDesc desc,
                                 std::function<void()> finish) {
  const auto start = Clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  if (!error_.empty()) throw CommError(error_);
  const uint64_t seq = issued_ + 1;
  if (seq > kSlots) {
    // The slot of operation seq - kSlots is reused: this rank reads it first (its handle may not
    // have been waited on yet), then every peer must have read it too.
    const uint64_t reuse = seq - kSlots;
    while (read_ < reuse) read_one(pending_.front());
    await_all(/*arrived=*/false, reuse, desc, start);
  }
  const at::Tensor dense = t.contiguous();
  std::memcpy(seg_->slot(seq, rank_), dense.data_ptr(), dense.numel() * dense.element_size());
  seg_->rank_state(rank_).arrived.store(seq, std::memory_order_release);
  publish(seg_->rank_state(rank_));
  issued_ = seq;
  pending_.push_back(Pending{seq, t, op, std::move(desc), std::move(finish), start});
  return std::make_shared<ShmWork>(shared_from_this(), seq);
}

void ShmAllReduce::complete(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  while (read_ < seq) {  // an operation already read stays done, even if a later one failed
    if (!error_.empty()) throw CommError(error_);
    read_one(pending_.front());
  }
}

void ShmAllReduce::read_one(Pending& p) {
  await_all(/*arrived=*/true, p.seq, p.desc, p.start);
  const char* rows[64];
  std::vector<const char*> many;
  const char** r = rows;
  if (world_ > 64) {
    many.resize(world_);
    r = many.data();
  }
  for (int i = 0; i < world_; ++i) r[i] = seg_->slot(p.seq, i);
  at::Tensor out = p.tensor.is_contiguous() ? p.tensor : at::empty_like(p.tensor).contiguous();
  reduce_into(out, r, world_, p.op);
  if (!out.is_same(p.tensor)) p.tensor.copy_(out);
  seg_->rank_state(rank_).done.store(p.seq, std::memory_order_release);
  publish(seg_->rank_state(rank_));
  read_ = p.seq;
  std::function<void()> finish = std::move(p.finish);
  pending_.pop_front();
  if (finish) finish();
}

int ShmAllReduce::first_behind(bool arrived, uint64_t seq) const {
  for (int r = 0; r < world_; ++r) {
    const ShmRankState& s = seg_->rank_state(r);
    const uint64_t v = (arrived ? s.arrived : s.done).load(std::memory_order_acquire);
    if (v < seq) return r;
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

void ShmAllReduce::await_all(bool arrived, uint64_t seq, const OpDesc& desc,
                             Clock::time_point start) {
  // Spin ~2 us (a peer running on the other core arrives within that; longer spins cost
  // ~20 us a call whenever the two ranks share a core, measured), yield up to 200 us (a peer
  // waiting for this core gets it), then sleep on the late peer's futex, woken by its next
  // publish (as a socket read wakes Gloo) or after 1 ms, when liveness and the deadline are
  // checked.
  int behind = first_behind(arrived, seq);
  if (behind < 0) return;
  const auto wait_start = Clock::now();
  const auto spin_end = wait_start + std::chrono::microseconds(2);
  const auto yield_end = wait_start + std::chrono::microseconds(200);
  auto next_check = wait_start + std::chrono::milliseconds(1);
  for (int i = 0;; ++i) {
    behind = first_behind(arrived, seq);
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
      if (!gone.empty())
        fail(desc, start,
             fmt::format("shared-memory all_reduce #{}: {} before {}", seq, gone,
                         arrived ? "contributing" : "reading the previous operation"));
      if (now - start > timeout_)
        fail(desc, start,
             fmt::format("shared-memory all_reduce #{}: rank {} (pid {}) did not {} in time", seq,
                         behind, seg_->rank_state(behind).pid.load(),
                         arrived ? "contribute" : "read the previous operation"));
    }
    if (now < yield_end) {
      ::sched_yield();
      continue;
    }
    ShmRankState& late = seg_->rank_state(behind);
    const uint32_t seen = late.futex.load();
    late.waiters.fetch_add(1);
    if (first_behind(arrived, seq) == behind) {
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
