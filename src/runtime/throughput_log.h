// Rank 0's progress line every steps_per_print optimizer steps:
//   [deepspeed] step=100 skipped=0 loss=2.3101 lr=[0.001] grad_norm=0.81 samples/s=412.3
// (fp16 adds loss_scale=65536).
// samples/s covers the steps since the previous line (all ranks' samples); the first line's
// interval starts where training began (the engine's first forward, a pipeline's first
// train_batch), not at the engine's construction, so a load_checkpoint in between is not counted.
// It is DeepSpeed's throughput timer (config timers.throughput): with enabled false the line
// leaves it out; with synchronized (on a CUDA device) the printing step first waits for the
// device, so the interval ends when the GPU work queued in it has run.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace deepspeed {

struct StepLogLine {
  int64_t step = 0;
  double loss = 0.0;
  std::vector<double> lr;
  double grad_norm = 0.0;
  int64_t samples_per_step = 0;
  int64_t skipped = 0;
  double loss_scale = 0.0;  // 0: not fp16, not printed
};

class ThroughputLog {
 public:
  using Clock = std::chrono::steady_clock;
  // Where training began, asked at the first step (the engine passes its wall-clock timers'
  // training_start()); nullopt: not known, and the first step, which has no start, is left out
  // of the first line's rate.
  using TrainingStart = std::function<std::optional<Clock::time_point>()>;
  void start_from(TrainingStart training_start) { training_start_ = std::move(training_start); }
  // timers.throughput: `enabled` false leaves samples/s out of the line; `synchronize` (may be
  // empty) runs before the time that ends a printed interval is taken.
  void configure(bool enabled, std::function<void()> synchronize) {
    enabled_ = enabled;
    synchronize_ = std::move(synchronize);
  }
  // Called at each optimizer step; prints when step % every == 0 and print is true.
  void on_step(const StepLogLine& line, int64_t every, bool print);
  // The start of the interval the next line's samples/s covers (nullopt before the first step).
  std::optional<Clock::time_point> interval_start() const { return last_; }

 private:
  TrainingStart training_start_;
  bool enabled_ = true;
  std::function<void()> synchronize_;
  std::optional<Clock::time_point> last_;
  int64_t steps_since_print_ = 0;
};

}  // namespace deepspeed
