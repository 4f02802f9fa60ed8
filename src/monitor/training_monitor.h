// What the engine reports while it trains: the monitors' events (tensorboard, csv_monitor), the
// wall_clock_breakdown timers and the comms_logger summary. One per engine; the engine calls it
// at fixed points of its loop (src/runtime/engine.cpp) and it decides, from the config, what
// each call does. With every block off a call costs a branch.
// Not thread-safe: the training thread only.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "comm/op_observer.h"
#include "comm/stats.h"
#include "deepspeed/comm.h"
#include "deepspeed/config.h"
#include "deepspeed/flops_profiler.h"
#include "deepspeed/memory.h"
#include "deepspeed/monitor.h"
#include "monitor/wall_clock.h"

namespace deepspeed {
namespace monitor {

// One optimizer step as the engine saw it.
struct StepRecord {
  int64_t global_steps = 0;
  int64_t global_samples = 0;  // the x-axis of every event
  double loss = 0.0;           // mean over data-parallel ranks of the GAS-summed micro losses
  double lr = 0.0;             // first parameter group's
  double loss_scale = 0.0;     // written only with fp16
  bool fp16 = false;
  double grad_norm = 0.0;
  int64_t samples_per_step = 0;  // train_batch_size
};

// What the flops profiler's summary and the memory lines need from the engine.
struct EngineFacts {
  std::shared_ptr<torch::nn::Module> module;
  std::function<MemoryReport()> memory;  // the stage's model-state bytes
  int world_size = 1, dp_size = 1, mp_size = 1;
};

class TrainingMonitor {
 public:
  // `comm`: the engine's data-parallel communicator. The comms table covers its whole stats
  // family (comm::StatsRecorder::family: the world it was split from and every group split from
  // that world — a topology's tensor, pipeline and data-parallel groups, tied and ZeRO++ groups),
  // each call counted once, on the group it ran on; a communicator without a recorder (a test
  // double) alone.
  // `writer`: whether this rank is the job's one reporting rank, global rank 0 as in DeepSpeed
  // (a data-parallel rank 0 is not enough: with tensor parallelism every tensor rank is one of
  // its group, with a pipeline every stage's first rank). Only it writes the monitors, prints the
  // timer, memory and comms lines and runs the flops profiler; a pipeline's is chosen by
  // as_pipeline_stage(). Creates the monitors' directories now (on the writer), so a bad
  // output_path fails in initialize().
  TrainingMonitor(const Config& config, comm::CommunicatorPtr comm, c10::Device device,
                  bool writer);
  ~TrainingMonitor();  // flushes the monitors; prints the comms summary when comms_logger is on

  // This engine is a pipeline stage (initialize_pipeline, before any step): `writer` replaces the
  // constructor's. The pipeline's writer is the last stage's first rank, the only one that knows
  // the loss when the step's events are written (DeepSpeed's global rank 0 is sent it first), and
  // its train_loss is written at the global sample count after the step, as DeepSpeed's
  // train_batch writes it. A pipeline is not flops-profiled.
  void as_pipeline_stage(bool writer);
  bool writer() const { return writer_; }

  WallClockTimers& timers() { return timers_; }
  std::shared_ptr<Monitor> monitor() const { return monitor_; }

  // After every optimizer step. `writer`: whether the engine logs this step here (it is this
  // rank's writer() in every layout; both must hold). Sends the step's events; every
  // steps_per_print steps prints the timer lines and flushes.
  void on_step(const StepRecord& step, bool writer);

  // Once the stage is built (initialize()): the model for the flops profiler, the model states
  // for the memory lines.
  void attach(EngineFacts facts);
  // Around every forward of Engine::forward: at the optimizer step flops_profiler.profile_step
  // (global_steps before the step, as DeepSpeed), on the printing rank, the flops profiler records
  // the forward's operators; the step's end prints its report.
  void before_forward(int64_t global_steps);
  void after_forward();
  // DeepSpeed's see_memory_usage lines (memory_usage.h) with this rank's model states; printed
  // when `print` on the writer, which then, as DeepSpeed, resets the GPU allocator's peaks: the
  // next lines' Max_MA / Max_CA are the peaks since these. Returned in any case.
  std::string see_memory_usage(const std::string& message, bool print) const;

  // From now on the comms_logger counts (initialize() calls it when the engine is built, so its
  // own weight broadcast is left out).
  void mark_comms_start();
  // The comms_logger table (empty when comms_logger is off); printed when `print` on the writer.
  std::string comms_summary(bool print) const;

 private:
  std::vector<Event> step_events(const StepRecord& step);
  // Milliseconds of all-gather latency the communicator has recorded so far (ZeRO-3's gathers).
  double all_gather_ms() const;
  void print_flops_profile(const StepRecord& step);

  // The comms_logger.verbose / .debug observer, on the writer only.
  void observe_ops(bool on);

  Config config_;
  comm::CommunicatorPtr comm_;
  bool writer_;
  bool pipeline_ = false;  // as_pipeline_stage() was called
  std::shared_ptr<Monitor> monitor_;
  WallClockTimers timers_;
  c10::Device device_;
  std::set<std::string> prof_ops_;  // our names (comm_op_names.h); empty: every op
  // One communicator's counts as the comms table reads them: a recorder of comm_'s family, or
  // (none: a test double) comm_ itself; with its stats and stats_resets() at the baseline (when
  // the engine was built; a later reset_stats() voids it).
  struct CommsBaseline {
    std::shared_ptr<const comm::StatsRecorder> recorder;  // null: comm_
    comm::CommStats stats;
    int64_t resets = 0;
  };
  std::vector<CommsBaseline> comms_now() const;
  std::vector<CommsBaseline> baselines_;
  // comms_logger.verbose / .debug on the printing rank: told of each completed collective, prints
  // it (verbose) and counts it under "<op> | [Caller Func: <engine phase>]" (debug).
  std::shared_ptr<const comm::OpObserver> verbose_;
  void observe(const std::string& op, int64_t bytes, double ms, int world);
  mutable std::mutex debug_mu_;
  // comms_logger.debug: the collectives by caller, by the size of their group (their n).
  std::map<int, comm::CommStats> debug_stats_;
  std::atomic<bool> debug_counting_{false};  // from mark_comms_start() on, as the plain table
  // The end of the last optimizer step (step_time_ms); before the first, the start of training
  // (WallClockTimers::training_start()).
  std::optional<std::chrono::steady_clock::time_point> last_step_end_;
  EngineFacts facts_;
  // flops_profiler.enabled on the printing rank; null elsewhere.
  std::unique_ptr<profiling::FlopsProfiler> profiler_;
  bool profiling_step_ = false;  // the profiler watched this optimizer step's forwards
  // ZeRO-3 with wall_clock_breakdown: the parameter gathers' time per optimizer step, the sum of
  // their all-gathers' launch-to-wait latencies (comm stats), shown as "gather" on the timer line.
  bool gather_timer_ = false;
  double gather_seen_ms_ = 0.0;      // all-gather latency recorded up to the last step's end
  double gather_last_ms_ = 0.0;      // the last optimizer step's
  double gather_interval_ms_ = 0.0;  // summed over the print interval
  int64_t gather_steps_ = 0;
};

}  // namespace monitor
}  // namespace deepspeed
