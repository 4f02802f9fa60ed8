#include "comm/work.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <exception>
#include <stdexcept>

#include "comm/dtypes.h"
#include "comm/peer_watch.h"

namespace deepspeed {
namespace comm {

std::string failure_message(const OpDesc& d, double elapsed_s, const std::string& cause) {
  std::string what = d.op;
  if (d.has_tensor) what += fmt::format(" of {} elements ({})", d.numel, dtype_name(d.dtype));
  return fmt::format("{} on rank {} of {} failed after {:.1f} s (timeout {:g} s): {}", what, d.rank,
                     d.world_size, elapsed_s, d.timeout.count() / 1000.0, cause);
}

std::string current_exception_message() {
  try {
    throw;
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

GlooWork::GlooWork(c10::intrusive_ptr<c10d::Work> work, OpDesc desc, std::function<void()> finish)
    : GlooWork(std::vector<c10::intrusive_ptr<c10d::Work>>{std::move(work)}, std::move(desc),
               std::move(finish)) {}

GlooWork::GlooWork(std::vector<c10::intrusive_ptr<c10d::Work>> works, OpDesc desc,
                   std::function<void()> finish)
    : works_(std::move(works)),
      desc_(std::move(desc)),
      finish_(std::move(finish)),
      start_(std::chrono::steady_clock::now()) {}

namespace {

// c10d::Work::wait(timeout) throws "Operation timed out!" and leaves the work as it was when the
// slice ends first; a finished work (done or failed) reports isCompleted().
void wait_watching(const c10::intrusive_ptr<c10d::Work>& handle, const OpPosition& pos) {
  c10d::Work& work = *handle;
  if (!pos.board) {
    work.wait();
    return;
  }
  if (pos.blocking) {  // point-to-point: whole, under the watcher's eye
    auto watched = pos.board->watch(handle, pos);
    bool completed = false;
    try {
      completed = work.wait();
    } catch (...) {
      pos.board->unwatch(watched);
      throw;
    }
    const std::string why = pos.board->unwatch(watched);
    if (!why.empty()) throw std::runtime_error(why);
    if (!completed) throw std::runtime_error("the transfer was aborted");
    return;
  }
  for (;;) {
    try {
      work.wait(kFailureCheckSlice);
      return;
    } catch (...) {
      // Completed meanwhile (the timeout's exception takes a while to build): waited on again,
      // it returns, or throws the collective's own failure.
      if (work.isCompleted()) {
        work.wait();
        return;
      }
    }
    const std::string why = pos.board->why_stuck(pos);
    if (!why.empty()) throw std::runtime_error(why);
  }
}

}  // namespace

void GlooWork::wait() {
  if (!error_.empty()) throw CommError(error_);
  if (done_) return;
  try {
    // Gloo enforces the group's timeout on every transfer, so an unbounded wait here still ends.
    for (auto& w : works_) wait_watching(w, desc_.position);
  } catch (...) {
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start_;
    error_ = failure_message(desc_, elapsed.count(), current_exception_message()) +
             peer_watch_report();
    works_.clear();
    throw CommError(error_);
  }
  works_.clear();
  if (finish_) finish_();
  finish_ = nullptr;
  done_ = true;
}

}  // namespace comm
}  // namespace deepspeed
