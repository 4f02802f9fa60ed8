#include "monitor/training_monitor.h"

#include <cstdio>

#include "monitor/comms_summary.h"

namespace deepspeed {
namespace monitor {
namespace {

// comms_logger.prof_ops (validated by the config reader; kept in the raw document).
std::set<std::string> prof_ops_of(const Config& config) {
  std::set<std::string> ops;
  const auto& raw = config.raw;
  if (!config.comms_logger.prof_all && raw.is_object() && raw.contains("comms_logger")) {
    const auto& block = raw.at("comms_logger");
    if (block.is_object() && block.contains("prof_ops") && block.at("prof_ops").is_array())
      for (const auto& op : block.at("prof_ops")) ops.insert(op.get<std::string>());
  }
  return ops;
}

// `now` minus `before`: the collectives issued since `before` was taken (max_ms stays the
// maximum over the whole life of the communicator).
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
      if (s.calls <= 0) it->second.by_size.erase(size);
    }
  }
  return now;
}

}  // namespace

TrainingMonitor::TrainingMonitor(const Config& config, comm::CommunicatorPtr comm,
                                 c10::Device device)
    : config_(config),
      comm_(std::move(comm)),
      monitor_(make_monitor(config, comm_->rank() == 0)),
      timers_(config.wall_clock_breakdown, device),
      prof_ops_(prof_ops_of(config)),
      baseline_(comm_->stats()),
      last_step_end_(std::chrono::steady_clock::now()) {
  const auto& cl = config.comms_logger;
  if (cl.enabled && cl.verbose && comm_->rank() == 0) {
    verbose_ = std::make_shared<const comm::OpObserver>(
        [ops = prof_ops_](const std::string& op, int64_t bytes, double ms, int world) {
          if (!ops.empty() && !ops.count(op)) return;
          std::printf("[Rank 0] %s\n", verbose_line(op, bytes, ms, world).c_str());
        });
    comm::set_op_observer(verbose_);
  }
}

TrainingMonitor::~TrainingMonitor() {
  if (verbose_) comm::clear_op_observer(verbose_);
  try {
    monitor_->flush();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[deepspeed] monitor: %s\n", e.what());
  }
  if (config_.comms_logger.enabled) comms_summary(/*print=*/comm_->rank() == 0);
}

std::vector<Event> TrainingMonitor::step_events(const StepRecord& step) {
  const auto now = std::chrono::steady_clock::now();
  const double step_ms = std::chrono::duration<double, std::milli>(now - last_step_end_).count();
  last_step_end_ = now;
  const int64_t x = step.global_samples;
  std::vector<Event> events = {
      {"Train/Samples/train_loss", step.loss, x},
      {"Train/Samples/lr", step.lr, x},
  };
  if (step.fp16) events.push_back({"Train/Samples/loss_scale", step.loss_scale, x});
  events.push_back({"Train/Samples/grad_norm", step.grad_norm, x});
  events.push_back({"Train/Samples/step_time_ms", step_ms, x});
  if (step_ms > 0)
    events.push_back({"Train/Samples/samples_per_second", step.samples_per_step * 1e3 / step_ms, x});
  if (timers_.enabled()) {
    const auto ms = timers_.last_step_ms();
    for (int i = 0; i < kPhaseCount; ++i)
      events.push_back({std::string("Train/Samples/elapsed_time_ms_") +
                            phase_event_name(static_cast<Phase>(i)),
                        ms[i], x});
  }
  return events;
}

void TrainingMonitor::on_step(const StepRecord& step, bool writer) {
  timers_.end_optimizer_step();
  if (monitor_->enabled() && writer) monitor_->write_events(step_events(step));
  // steps_per_print <= 0 (no step line): flush every step, print no timer lines.
  const int64_t every = config_.steps_per_print;
  if (every > 0 && step.global_steps % every != 0) return;
  const auto lines = every > 0 ? timers_.interval_lines() : std::vector<std::string>{};
  if (writer) {
    for (const auto& line : lines) std::printf("[Rank %d] %s\n", comm_->rank(), line.c_str());
    if (!lines.empty()) std::fflush(stdout);
  }
  monitor_->flush();
}

std::string TrainingMonitor::comms_summary(bool print) const {
  if (!config_.comms_logger.enabled) return "";
  const std::string table = comms_summary_table(since(comm_->stats(), baseline_), comm_->world_size(),
                                                prof_ops_);
  if (print) {
    std::fputs(table.c_str(), stdout);
    std::fflush(stdout);
  }
  return table;
}

}  // namespace monitor
}  // namespace deepspeed
