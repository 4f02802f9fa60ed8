// Training monitors (DeepSpeed's deepspeed.monitor): scalar events written to TensorBoard event
// files ("tensorboard" block) and CSV files ("csv_monitor" block), as DeepSpeed writes them.
//
// The engine writes, on the job's one reporting rank (global rank 0, as DeepSpeed; under a
// pipeline the last stage's first rank, the one that has the loss), at every optimizer step, with
// the global sample count as x-axis (train_loss's the count before the step, as DeepSpeed's):
//   Train/Samples/train_loss, Train/Samples/lr, Train/Samples/loss_scale (fp16 only),
//   Train/Samples/elapsed_time_ms_* (wall_clock_breakdown), and Train/Samples/grad_norm,
//   step_time_ms, samples_per_second (docs/monitoring.md lists them all).
// Users add their own events through Engine::monitor() (DeepSpeed's engine.monitor); gpt_train
// writes Train/Samples/tokens_per_second that way.
//
// Thread-safety: not thread-safe; call from the training thread.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "deepspeed/config.h"

namespace deepspeed {
namespace monitor {

// One scalar: DeepSpeed's (log_name, value, step) tuple.
struct Event {
  std::string tag;
  double value = 0.0;
  int64_t step = 0;
};

class Monitor {
 public:
  virtual ~Monitor() = default;
  // False when no monitor block is enabled or on ranks that do not write: write_events is then a
  // no-op.
  virtual bool enabled() const = 0;
  // Appends the events to every enabled monitor (TensorBoard: one record per event; CSV: one row
  // in the file of each tag). Buffered until flush().
  virtual void write_events(const std::vector<Event>& events) = 0;
  // Pushes buffered events to the files (the engine calls it every steps_per_print steps and at
  // destruction), so a run killed later keeps them.
  virtual void flush() = 0;
};

// The monitors `config` enables. `writer` says whether this process writes (the engine passes
// true on its reporting rank only); on the others, and when no block is enabled, the monitor is
// disabled.
// Creates <output_path>/<job_name>/ for each enabled monitor; throws ConfigError naming the key
// (e.g. 'tensorboard.output_path') and the path when it cannot be created or written.
std::shared_ptr<Monitor> make_monitor(const Config& config, bool writer);

}  // namespace monitor
}  // namespace deepspeed
