#include "monitor/training_monitor.h"

#include <algorithm>
#include <cstdio>

#include "comm/communicator_base.h"
#include "comm/stats.h"
#include "deepspeed/device.h"
#include "monitor/comm_op_names.h"
#include "monitor/comms_summary.h"
#include "monitor/memory_usage.h"

namespace deepspeed {
namespace monitor {
namespace {

// comms_logger.prof_ops (validated by the config reader, which warns of a name that selects
// nothing; kept in the raw document) as our names: DeepSpeed's select ours. Empty: every op
// (prof_all). A name that selects nothing stays in the set, so that a list of such names shows
// no op (not every op); so does kNoOp, which stands for "prof_all false and no prof_ops": DeepSpeed
// then logs nothing (timed_op logs an op only with prof_all or when prof_ops names it).
const char* const kNoOp = "";
std::set<std::string> prof_ops_of(const Config& config) {
  std::set<std::string> ops;
  if (config.comms_logger.prof_all) return ops;
  ops.insert(kNoOp);
  const auto& raw = config.raw;
  if (raw.is_object() && raw.contains("comms_logger")) {
    const auto& block = raw.at("comms_logger");
    if (block.is_object() && block.contains("prof_ops") && block.at("prof_ops").is_array())
      for (const auto& entry : block.at("prof_ops")) {
        const std::string name = entry.get<std::string>();
        const std::set<std::string> named = recorded_ops_named(name);
        if (named.empty()) ops.insert(name);
        ops.insert(named.begin(), named.end());
      }
  }
  return ops;
}

// `now` minus `before`: the collectives issued since `before` was taken. Latencies are appended
// in the order calls complete, so those since `before` are the entries after the ones it held
// (REQUIRES: no reset_stats() in between); max_ms is theirs when they are all kept, else it
// stays the maximum over the whole life of the communicator.
comm::CommStats since(comm::CommStats now, const comm::CommStats& before) {
  for (const auto& [op, b] : before) {
    auto it = now.find(op);
    if (it == now.end()) continue;
    it->second.calls -= b.calls;
    it->second.bytes -= b.bytes;
    for (const auto& [size, bs] : b.by_size) {
      auto& s = it->second.by_size[size];
      s.calls -= bs.calls;
      s.total_ms -= bs.total_ms;
      auto& lat = s.latencies_ms;
      lat.erase(lat.begin(), lat.begin() + std::min(lat.size(), bs.latencies_ms.size()));
      if (s.calls > 0 && static_cast<int64_t>(lat.size()) == s.calls)
        s.max_ms = *std::max_element(lat.begin(), lat.end());
      if (s.calls <= 0) it->second.by_size.erase(size);
    }
  }
  return now;
}

// The table's averages are trimmed means of each call's latency: with comms_logger on, every
// communicator of the family keeps them (the root's flag reaches every group split from it,
// before or after) from before the baseline is taken.
void keep_latencies_of_family(const Config& config, comm::Communicator& comm) {
  if (!config.comms_logger.enabled) return;
  const auto family = comm::StatsRecorder::family(comm::recorder_of(comm));
  if (family.empty())
    comm.keep_latencies();
  else
    family.front()->keep_latencies();
}

}  // namespace

TrainingMonitor::TrainingMonitor(const Config& config, comm::CommunicatorPtr comm,
                                 c10::Device device, bool writer)
    : config_(config),
      comm_(std::move(comm)),
      writer_(writer),
      monitor_(make_monitor(config, writer)),
      timers_(config.wall_clock_breakdown, device),
      device_(device),
      prof_ops_(prof_ops_of(config)),
      gather_timer_(config.wall_clock_breakdown && config.zero_optimization.stage == 3) {
  keep_latencies_of_family(config, *comm_);
  baselines_ = comms_now();
  observe_ops(writer_);
}

std::vector<TrainingMonitor::CommsBaseline> TrainingMonitor::comms_now() const {
  const auto family = comm::StatsRecorder::family(comm::recorder_of(*comm_));
  if (family.empty()) return {{nullptr, comm_->stats(), comm_->stats_resets()}};
  std::vector<CommsBaseline> out;
  for (const auto& r : family) out.push_back({r, r->snapshot(), r->resets()});
  return out;
}

void TrainingMonitor::mark_comms_start() {
  baselines_ = comms_now();
  gather_seen_ms_ = all_gather_ms();
  debug_counting_.store(true);
}

void TrainingMonitor::observe_ops(bool on) {
  const auto& cl = config_.comms_logger;
  if (on && !verbose_ && cl.enabled && (cl.verbose || cl.debug)) {
    verbose_ = std::make_shared<const comm::OpObserver>(
        [this](const std::string& op, int64_t bytes, double ms, int world) {
          observe(op, bytes, ms, world);
        });
    comm::set_op_observer(verbose_);
  } else if (!on && verbose_) {
    comm::clear_op_observer(verbose_);
    verbose_ = nullptr;
  }
}

void TrainingMonitor::as_pipeline_stage(bool writer) {
  pipeline_ = true;
  profiler_.reset();
  if (writer == writer_) return;
  writer_ = writer;
  monitor_ = make_monitor(config_, writer);
  observe_ops(writer);
}

// DeepSpeed's debug names an op after the Python function that issued it; the C++ counterpart is
// the engine call it completed in (forward, backward, bwd_inner, bwd_allreduce, step).
void TrainingMonitor::observe(const std::string& op, int64_t bytes, double ms, int world) {
  if (!prof_ops_.empty() && !prof_ops_.count(op)) return;
  std::string name = op;
  if (config_.comms_logger.debug && debug_counting_.load()) {
    if (const char* phase = timers_.current_phase_name())
      name += std::string(" | [Caller Func: ") + phase + "]";
    std::lock_guard<std::mutex> lock(debug_mu_);
    auto& s = debug_stats_[world][name];
    s.calls += 1;
    s.bytes += bytes;
    comm::StatsRecorder::add_call(s.by_size[bytes], ms, /*keep=*/true);
  }
  if (config_.comms_logger.verbose)
    std::printf("[Rank 0] %s\n", verbose_line(name, bytes, ms, world).c_str());
}

TrainingMonitor::~TrainingMonitor() {
  if (verbose_) comm::clear_op_observer(verbose_);
  try {
    monitor_->flush();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[deepspeed] monitor: %s\n", e.what());
  }
  if (config_.comms_logger.enabled) comms_summary(/*print=*/true);
}

std::vector<Event> TrainingMonitor::step_events(const StepRecord& step) {
  const auto now = std::chrono::steady_clock::now();
  // The first step counts from the start of training (its first forward, a pipeline's first
  // train_batch), not from the engine's construction; a step with neither before it (a user's
  // own forward and backward outside the timers) has no start to count from and no rate.
  std::optional<double> step_ms;
  if (!last_step_end_) last_step_end_ = timers_.training_start();
  if (last_step_end_)
    step_ms = std::chrono::duration<double, std::milli>(now - *last_step_end_).count();
  last_step_end_ = now;
  const int64_t x = step.global_samples;
  // DeepSpeed's engine writes train_loss in backward(), before the step adds its samples; its
  // pipeline's train_batch after the step.
  const int64_t loss_x = pipeline_ ? x : x - step.samples_per_step;
  std::vector<Event> events = {
      {"Train/Samples/train_loss", step.loss, loss_x},
      {"Train/Samples/lr", step.lr, x},
  };
  if (step.fp16) events.push_back({"Train/Samples/loss_scale", step.loss_scale, x});
  events.push_back({"Train/Samples/grad_norm", step.grad_norm, x});
  if (step_ms) events.push_back({"Train/Samples/step_time_ms", *step_ms, x});
  if (step_ms && *step_ms > 0)
    events.push_back(
        {"Train/Samples/samples_per_second", step.samples_per_step * 1e3 / *step_ms, x});
  if (gather_timer_) events.push_back({"Train/Samples/elapsed_time_ms_gather", gather_last_ms_, x});
  // Only the phases this step timed (a pipeline's: `step`), as the printed lines show them.
  const auto ms = timers_.last_step_ms();
  const auto timed = timers_.last_step_timed();
  for (int i = 0; i < kPhaseCount; ++i)
    if (timed[i])
      events.push_back({std::string("Train/Samples/elapsed_time_ms_") +
                            phase_event_name(static_cast<Phase>(i)),
                        ms[i], x});
  return events;
}

double TrainingMonitor::all_gather_ms() const { return comm_->total_ms("all_gather"); }

void TrainingMonitor::attach(EngineFacts facts) {
  facts_ = std::move(facts);
  if (config_.flops_profiler.enabled && writer_ && !pipeline_ && facts_.module)
    profiler_ = std::make_unique<profiling::FlopsProfiler>(facts_.module);
}

void TrainingMonitor::before_forward(int64_t global_steps) {
  if (!profiler_ || global_steps != config_.flops_profiler.profile_step) return;
  profiler_->resume_profile();  // a second micro-step's forward adds to the first's counts
  profiling_step_ = true;
}

void TrainingMonitor::after_forward() {
  if (profiler_) profiler_->stop_profile();
}

void TrainingMonitor::print_flops_profile(const StepRecord& step) {
  profiler_->stop_profile();  // a forward that threw never reached after_forward()
  const auto& fp = config_.flops_profiler;
  const auto ms = timers_.last_step_ms();
  profiling::RunFacts f;
  f.from_engine = true;
  f.world_size = facts_.world_size;
  f.dp_size = facts_.dp_size;
  f.mp_size = facts_.mp_size;
  f.micro_batch_size = config_.train_micro_batch_size_per_gpu;
  if (timers_.enabled()) {
    f.fwd_latency_s = ms[static_cast<int>(Phase::kForward)] / 1e3;
    f.bwd_latency_s = ms[static_cast<int>(Phase::kBackward)] / 1e3;
    f.step_latency_s = ms[static_cast<int>(Phase::kStep)] / 1e3;
  }
  f.samples_per_iter = step.samples_per_step;
  f.recompute_fwd_factor = fp.recompute_fwd_factor;
  f.peak_tflops = fp.peak_tflops;
  // DeepSpeed prints its global_steps after the step's increment: profile_step + 1.
  profiling::ReportOptions o{step.global_steps, fp.module_depth, fp.top_modules, fp.detailed};
  try {
    profiler_->print_model_profile(o, f, fp.output_file);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[deepspeed] flops profiler: %s\n", e.what());
  }
  profiler_->end_profile();
  profiling_step_ = false;
}

std::string TrainingMonitor::see_memory_usage(const std::string& message, bool print) const {
  const MemoryReport states = facts_.memory ? facts_.memory() : MemoryReport{};
  std::string text;
  for (const auto& line : memory_usage_lines(message, states, device_)) text += line + "\n";
  if (print && writer_) {
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
    // DeepSpeed's see_memory_usage ends with reset_peak_memory_stats() (on the rank that
    // printed): each report's Max_MA / Max_CA are the peaks since the one before.
    if (device_.is_cuda()) reset_device_memory_peaks(device_);
  }
  return text;
}

void TrainingMonitor::on_step(const StepRecord& step, bool writer) {
  timers_.end_optimizer_step();
  if (gather_timer_) {
    const double seen = all_gather_ms();
    // reset_stats() (gpt_train calls it after warm-up) restarts the count from 0.
    gather_last_ms_ = seen >= gather_seen_ms_ ? seen - gather_seen_ms_ : seen;
    gather_seen_ms_ = seen;
    gather_interval_ms_ += gather_last_ms_;
    ++gather_steps_;
  }
  if (profiling_step_) print_flops_profile(step);
  // DeepSpeed users call see_memory_usage themselves; one look after the first step (the
  // optimizer states exist by then) shows what the run holds. memory_breakdown: every print.
  const bool memory_now = step.global_steps == 1 ||
                          (config_.memory_breakdown && config_.steps_per_print > 0 &&
                           step.global_steps % config_.steps_per_print == 0);
  writer = writer && writer_;
  if (memory_now && writer)
    see_memory_usage("[Rank " + std::to_string(comm_->rank()) + "] memory after step " +
                         std::to_string(step.global_steps),
                     /*print=*/true);
  if (monitor_->enabled() && writer) monitor_->write_events(step_events(step));
  // steps_per_print <= 0 (no step line): flush every step, print no timer lines.
  const int64_t every = config_.steps_per_print;
  if (every > 0 && step.global_steps % every != 0) return;
  auto lines = every > 0 ? timers_.interval_lines() : std::vector<std::string>{};
  if (gather_timer_ && lines.size() == 2 && gather_steps_ > 0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, " | gather: %.2f", gather_interval_ms_ / gather_steps_);
    lines[1] += buf;
    gather_interval_ms_ = 0.0;
    gather_steps_ = 0;
  }
  if (writer) {
    for (const auto& line : lines) std::printf("[Rank %d] %s\n", comm_->rank(), line.c_str());
    if (!lines.empty()) std::fflush(stdout);
  }
  monitor_->flush();
}

std::string TrainingMonitor::comms_summary(bool print) const {
  if (!config_.comms_logger.enabled) return "";
  std::vector<GroupStats> groups;
  const bool debug = config_.comms_logger.debug && writer_;
  if (debug) {
    // The observer's counts by caller (already filtered by prof_ops), by group size.
    std::lock_guard<std::mutex> lock(debug_mu_);
    for (const auto& [n, stats] : debug_stats_) groups.push_back({stats, n});
  } else {
    // Every communicator's own counts since its baseline; one reset since (gpt_train's, after
    // warm-up) voids that baseline, and all it holds is after it; a group that did not exist at
    // the baseline counts whole.
    for (CommsBaseline& now : comms_now()) {
      const auto before =
          std::find_if(baselines_.begin(), baselines_.end(),
                       [&](const CommsBaseline& b) { return b.recorder == now.recorder; });
      const bool applies = before != baselines_.end() && before->resets == now.resets;
      groups.push_back({applies ? since(std::move(now.stats), before->stats) : std::move(now.stats),
                        now.recorder ? now.recorder->world_size() : comm_->world_size()});
    }
  }
  const std::string table = comms_summary_table(groups, debug ? std::set<std::string>{} : prof_ops_);
  if (print && writer_) {
    std::fputs(table.c_str(), stdout);
    std::fflush(stdout);
  }
  return table;
}

}  // namespace monitor
}  // namespace deepspeed
