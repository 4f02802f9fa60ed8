#include "gpt/progress.h"

#include <unistd.h>

#include <cstdio>
#include <string>

#include "deepspeed/engine.h"

namespace gpt {
namespace {

std::string rate(double per_s) {
  char buf[32];
  if (per_s >= 1e6)
    std::snprintf(buf, sizeof buf, "%.1fM", per_s / 1e6);
  else if (per_s >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1fk", per_s / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f", per_s);
  return buf;
}

std::string duration(double s) {
  const long t = static_cast<long>(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, t % 3600 / 60);
  else if (t >= 60)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%lds", t);
  return buf;
}

}  // namespace

bool stdout_is_terminal() { return isatty(STDOUT_FILENO) == 1; }

bool engine_prints_at(const deepspeed::Config& config, int64_t step) {
  const auto& fp = config.flops_profiler;
  return (config.steps_per_print > 0 && step % config.steps_per_print == 0) ||
         (fp.enabled && step == fp.profile_step + 1);
}

ProgressLine::ProgressLine(int64_t total_steps, double tokens_per_step, bool terminal)
    : total_steps_(total_steps), tokens_per_step_(tokens_per_step), terminal_(terminal) {}

void ProgressLine::finish() {
  if (!drawn_) return;
  std::printf("\n");
  std::fflush(stdout);
  drawn_ = false;
}

void ProgressLine::on_step(int64_t step, double loss, bool exact, bool engine_prints_next) {
  if (!terminal_ || exact) {
    if (exact)
      std::printf("step %lld loss %.4f exact %a\n", static_cast<long long>(step), loss, loss);
    else
      std::printf("step %lld loss %.4f\n", static_cast<long long>(step), loss);
    return;
  }
  const auto now = Clock::now();
  std::string line = "step " + std::to_string(step) + "/" + std::to_string(total_steps_);
  char buf[64];
  std::snprintf(buf, sizeof buf, " | loss %.4f", loss);
  line += buf;
  if (rate_from_step_ < 0) {
    rate_from_ = now;
    rate_from_step_ = step;
  } else if (step > rate_from_step_) {
    const double s = std::chrono::duration<double>(now - rate_from_).count();
    const double per_step = s / static_cast<double>(step - rate_from_step_);
    if (per_step > 0) line += " | " + rate(tokens_per_step_ / per_step) + " tokens/s";
    line += " | ETA " + duration(per_step * static_cast<double>(total_steps_ - step));
  }
  // \r and "erase to end of line": the new text replaces the old, however long either is.
  std::printf("\r\033[K%s", line.c_str());
  std::fflush(stdout);
  drawn_ = true;
  if (engine_prints_next) finish();
}

TokensPerSecondEvent::TokensPerSecondEvent(double tokens_per_step)
    : tokens_per_step_(tokens_per_step), last_(std::chrono::steady_clock::now()) {}

void TokensPerSecondEvent::on_step(deepspeed::Engine& engine) {
  const auto now = std::chrono::steady_clock::now();
  if (auto monitor = engine.monitor(); monitor && monitor->enabled()) {
    const double s = std::chrono::duration<double>(now - last_).count();
    if (s > 0)
      monitor->write_events(
          {{"Train/Samples/tokens_per_second", tokens_per_step_ / s, engine.global_samples()}});
  }
  last_ = now;
}

}  // namespace gpt
