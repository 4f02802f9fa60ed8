// wall_clock_breakdown: DeepSpeed's engine timers. Each timer measures one phase of the training
// loop; the "micro" view is per micro-step (forward/backward/step call), the "global" view sums
// the micro-steps of one optimizer step. Names as DeepSpeed prints them:
//   fwd        forward()                        fwd_microstep
//   bwd        backward() as a whole            bwd_microstep
//   bwd_inner  autograd (loss.backward())       bwd_inner_microstep
//   bwd_allreduce  gradient reduction after autograd (all-reduce at stages 0/1, reduce-scatter
//              at 2/3; the name is DeepSpeed's for every stage)   bwd_allreduce_microstep
//   step       step()                           step_microstep
// bwd_inner and bwd_allreduce lie inside bwd; fwd + bwd + step cover the engine's share of an
// optimizer step. With overlap_comm, reduction that overlaps autograd is counted in bwd_inner.
// On a CUDA device each start/stop synchronizes it (as DeepSpeed's synchronized timers), so the
// phases are the GPU's time, not the launch time. Disabled timers cost one branch.
// Not thread-safe: the training thread only.
#pragma once
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/Device.h>

namespace deepspeed {
namespace monitor {

enum class Phase { kForward, kBackward, kBackwardInner, kBackwardReduce, kStep };
constexpr int kPhaseCount = 5;

// "fwd", "bwd", "bwd_inner", "bwd_allreduce", "step".
const char* phase_name(Phase p);
// DeepSpeed's monitor event for the phase: "forward", "backward", "backward_inner",
// "backward_allreduce", "step" (Train/Samples/elapsed_time_ms_<that>).
const char* phase_event_name(Phase p);

class WallClockTimers {
 public:
  WallClockTimers(bool enabled, c10::Device device) : enabled_(enabled), device_(device) {}
  bool enabled() const { return enabled_; }

  void start(Phase p) {
    if (!training_start_) begin_training();
    current_.store(static_cast<int>(p), std::memory_order_relaxed);
    if (enabled_) start_slow(p);
  }
  void stop(Phase p) {
    // bwd_inner and bwd_allreduce lie inside bwd; the others are outermost.
    const bool inner = p == Phase::kBackwardInner || p == Phase::kBackwardReduce;
    current_.store(inner ? static_cast<int>(Phase::kBackward) : -1, std::memory_order_relaxed);
    if (enabled_) stop_slow(p);
  }
  // The engine call running now (innermost), timed or not; nullptr between calls. Read by
  // comms_logger.debug from whichever thread completes a collective.
  const char* current_phase_name() const {
    const int p = current_.load(std::memory_order_relaxed);
    return p < 0 ? nullptr : phase_name(static_cast<Phase>(p));
  }
  // At an optimizer step's end (after stop(kStep)): the global timers of this step become
  // last_step_ms() and join the print interval's averages.
  void end_optimizer_step();

  // Milliseconds each phase took in the last optimizer step (all its micro-steps).
  std::array<double, kPhaseCount> last_step_ms() const { return last_step_; }
  // Whether each phase was timed in the last optimizer step: a pipeline's train_batch times only
  // `step` (it runs its forward and backward passes itself), so its other phases read 0 there
  // without having taken 0 ms. All false when the timers are off.
  std::array<bool, kPhaseCount> last_step_timed() const { return last_timed_; }

  // Where training began: the first start() of any phase, or an earlier begin_training() (a
  // pipeline's train_batch, whose forward passes come before its first timed phase). The
  // throughput figures' first interval starts here, not at the engine's construction, so what
  // came in between (load_checkpoint, building the data) is not counted as training time.
  // Tracked whether or not the timers are on; unset before either call.
  void begin_training() {
    if (!training_start_) training_start_ = std::chrono::steady_clock::now();
  }
  std::optional<std::chrono::steady_clock::time_point> training_start() const {
    return training_start_;
  }
  // DeepSpeed's two lines, averaged over the interval since the previous call (micro timers per
  // micro-step, global timers per optimizer step), then the interval is reset:
  //   time (ms) | fwd_microstep: 1.23 | bwd_microstep: ... | step_microstep: 0.45
  //   time (ms) | fwd: 4.92 | bwd: ... | bwd_inner: ... | bwd_allreduce: ... | step: 0.45
  // Empty when nothing was timed.
  std::vector<std::string> interval_lines();

 private:
  using Clock = std::chrono::steady_clock;
  void start_slow(Phase p);
  void stop_slow(Phase p);
  void synchronize() const;

  bool enabled_;
  c10::Device device_;
  std::atomic<int> current_{-1};  // the Phase running now, -1 none
  std::array<Clock::time_point, kPhaseCount> started_{};
  std::array<bool, kPhaseCount> running_{};
  std::array<double, kPhaseCount> this_step_{};      // global timers, current optimizer step
  std::array<double, kPhaseCount> last_step_{};      // global timers, previous optimizer step
  std::array<bool, kPhaseCount> this_timed_{};       // phases stopped in the current step
  std::array<bool, kPhaseCount> last_timed_{};       // ... in the previous step
  std::optional<Clock::time_point> training_start_;
  std::array<double, kPhaseCount> interval_sum_{};   // sum over the print interval
  std::array<int64_t, kPhaseCount> interval_micro_{};  // micro-steps timed per phase
  int64_t interval_steps_ = 0;                        // optimizer steps in the interval
};

}  // namespace monitor
}  // namespace deepspeed
