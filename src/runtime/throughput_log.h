// Rank 0's progress line every steps_per_print optimizer steps:
//   [deepspeed] step=100 skipped=0 loss=2.3101 lr=[0.001] grad_norm=0.81 samples/s=412.3
// (fp16 adds loss_scale=65536).
// samples/s covers the steps since the previous line (all ranks' samples).
#pragma once
#include <chrono>
#include <cstdint>
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
  void start() { last_ = std::chrono::steady_clock::now(); }
  // Called at each optimizer step; prints when step % every == 0 and print is true.
  void on_step(const StepLogLine& line, int64_t every, bool print);

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
  int64_t steps_since_print_ = 0;
};

}  // namespace deepspeed
