// gpt_train's per-step output. On a terminal: one line rewritten in place,
//   step 12/100 | loss 2.3456 | 12.3k tokens/s | ETA 1m05s
// Elsewhere (a pipe, a log file, the tests): the plain "step N loss X" lines, one per step.
#pragma once
#include <chrono>
#include <cstdint>

#include "deepspeed/config.h"

namespace deepspeed {
class Engine;
}

namespace gpt {

class ProgressLine {
 public:
  // `terminal`: rewrite one line (pass isatty(stdout)); `tokens_per_step`: for the rate.
  ProgressLine(int64_t total_steps, double tokens_per_step, bool terminal);
  ~ProgressLine() { finish(); }
  // Ends the terminal line (before other output follows it).
  void finish();
  // After each optimizer step (rank 0). `exact`: also the loss as a hex float (plain lines).
  // `engine_prints_next`: the engine prints during the next step (its steps_per_print line, the
  // flops profile), so the line is ended now instead of having that text glued to it.
  void on_step(int64_t step, double loss, bool exact, bool engine_prints_next = false);
  bool terminal() const { return terminal_; }

 private:
  using Clock = std::chrono::steady_clock;
  int64_t total_steps_;
  double tokens_per_step_;
  bool terminal_;
  bool drawn_ = false;
  // The rate is measured from the end of the first step (allocation and warm-up left out).
  Clock::time_point rate_from_;
  int64_t rate_from_step_ = -1;
};

// Train/Samples/tokens_per_second through the engine's monitor, once per optimizer step (the
// engine does not know what a token is): the step's tokens over the wall time since the previous
// step ended (for the first step: since this object was made). Every rank calls it; the monitor
// writes only where it is enabled (rank 0; a pipeline's last stage).
class TokensPerSecondEvent {
 public:
  explicit TokensPerSecondEvent(double tokens_per_step);
  void on_step(deepspeed::Engine& engine);

 private:
  double tokens_per_step_;
  std::chrono::steady_clock::time_point last_;
};

// Whether stdout is a terminal.
bool stdout_is_terminal();
// Whether the engine prints while running optimizer step `step` (1-based, as global_steps after
// it): the steps_per_print line (and the wall-clock lines with it) or the flops profile.
bool engine_prints_at(const deepspeed::Config& config, int64_t step);

}  // namespace gpt
