// One background host thread that runs tasks in the order they are posted: ZeRO-Offload's CPU
// Adam runs there, range by range, while the engine's thread goes on with backward
// (zero/step_during_backward.h). wait() blocks until every posted task has run and rethrows the
// first task's exception (the tasks after a failed one are dropped: the step is lost anyway).
// Each task carries a key (a range's first element) by which the tasks still queued can be put
// in another order (ZeRO-Offload's last ranges in the order the next forward reads them).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace deepspeed {
namespace offload {

class StepWorker {
 public:
  StepWorker();
  ~StepWorker();  // waits for the posted tasks (their errors are dropped), then joins
  StepWorker(const StepWorker&) = delete;
  StepWorker& operator=(const StepWorker&) = delete;

  void post(std::function<void()> task, int64_t key = 0);
  // Reorders the tasks not yet started, stably, so that a task with key a runs before one with
  // key b when before(a, b).
  void reorder(const std::function<bool(int64_t, int64_t)>& before);
  void wait();

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable wake_;   // the worker: a task, or stop
  std::condition_variable idle_;   // wait(): the queue ran dry
  struct Task {
    int64_t key;
    std::function<void()> run;
  };
  std::deque<Task> tasks_;
  bool running_ = false;  // a task is being run
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: started once the fields above exist
};

}  // namespace offload
}  // namespace deepspeed
