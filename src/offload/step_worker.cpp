#include "offload/step_worker.h"

#include <algorithm>

namespace deepspeed {
namespace offload {

StepWorker::StepWorker() : thread_([this] { loop(); }) {}

StepWorker::~StepWorker() {
  try {
    wait();
  } catch (...) {
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void StepWorker::post(std::function<void()> task, int64_t key) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_) return;  // this step has failed already; wait() reports it
    tasks_.push_back({key, std::move(task)});
  }
  wake_.notify_one();
}

void StepWorker::reorder(const std::function<bool(int64_t, int64_t)>& before) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::stable_sort(tasks_.begin(), tasks_.end(),
                   [&](const Task& a, const Task& b) { return before(a.key, b.key); });
}

void StepWorker::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [this] { return tasks_.empty() && !running_; });
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void StepWorker::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stop_, nothing left
    std::function<void()> task = std::move(tasks_.front().run);
    tasks_.pop_front();
    running_ = true;
    lock.unlock();
    std::exception_ptr failed;
    try {
      task();
    } catch (...) {
      failed = std::current_exception();
    }
    lock.lock();
    running_ = false;
    if (failed && !error_) {
      error_ = failed;
      tasks_.clear();
    }
    if (tasks_.empty()) idle_.notify_all();
  }
}

}  // namespace offload
}  // namespace deepspeed
