// Work handles and the description of a collective that failure messages are built from.
#pragma once
#include <ATen/Tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "comm/failure_board.h"
#include "deepspeed/comm.h"

namespace deepspeed {
namespace comm {

// What a collective was, for error messages: "all_reduce of 1048576 elements (float) on rank 1
// of 2".
struct OpDesc {
  std::string op;
  bool has_tensor = true;  // false for barrier
  int64_t numel = 0;
  at::ScalarType dtype = at::kFloat;
  int rank = 0;
  int world_size = 1;
  std::chrono::milliseconds timeout{0};
  // Its place on its channel (failure_board.h). With a board, a wait that outlasts a slice asks
  // it whether a failed peer will never join (point-to-point: the board's watcher asks, and
  // aborts the wait); without (world size 1, NCCL), the wait is bounded by the timeout alone.
  OpPosition position;
};

// "<desc> failed after 2.0 s (timeout 2 s): <cause>".
std::string failure_message(const OpDesc& desc, double elapsed_s, const std::string& cause);

// The message of the exception in flight, without libtorch's C++ backtrace.
std::string current_exception_message();

// A handle for work that already finished (local collectives, zero-element ones).
class DoneWork : public Work {
 public:
  void wait() override {}
};

// Waits for `inner`, then runs `finish` once (the default collectives built on another one:
// copying a temporary out into the caller's tensors). wait() again returns at once.
class ThenWork : public Work {
 public:
  ThenWork(WorkPtr inner, std::function<void()> finish)
      : inner_(std::move(inner)), finish_(std::move(finish)) {}
  void wait() override {
    if (!inner_) return;
    inner_->wait();
    inner_.reset();
    finish_();
    finish_ = nullptr;
  }

 private:
  WorkPtr inner_;
  std::function<void()> finish_;
};

// Wraps c10d works (one, or several that make one collective, e.g. all_gather's per-rank
// broadcasts): wait() waits for each, turns the first failure into CommError and then runs
// `finish` (copying a converted or staged result back into the caller's tensor). wait() may be
// called again: it returns at once, or rethrows the same failure. With a failure board, each
// work is waited on in slices, and a peer's posted failure that abandons this operation fails
// it at the end of a slice (the Gloo work itself stays queued: the group is not reused).
class GlooWork : public Work {
 public:
  GlooWork(c10::intrusive_ptr<c10d::Work> work, OpDesc desc, std::function<void()> finish);
  GlooWork(std::vector<c10::intrusive_ptr<c10d::Work>> works, OpDesc desc,
           std::function<void()> finish);
  void wait() override;

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  OpDesc desc_;
  std::function<void()> finish_;
  std::chrono::steady_clock::time_point start_;
  bool done_ = false;
  std::string error_;
};

}  // namespace comm
}  // namespace deepspeed
