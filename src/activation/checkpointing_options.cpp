#include "activation/checkpointing_options.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <string>

#include "deepspeed/config.h"
#include "deepspeed/errors.h"

namespace deepspeed {
namespace checkpointing {
namespace {

struct Registry {
  std::mutex mutex;
  Options options;
  Stats stats;
  int64_t live = 0;  // checkpoints whose inputs are held now
  bool warned_partition = false;
};

Registry& registry() {
  static Registry r;
  return r;
}

// Per thread (see set_model_parallel_group): ranks run as threads in the dist tests.
thread_local comm::CommunicatorPtr model_parallel;

bool has_partition_group() { return model_parallel && model_parallel->world_size() > 1; }

}  // namespace

void configure(const Options& options) {
  if (options.contiguous_memory_optimization && !options.number_checkpoints)
    throw ConfigError(
        "activation_checkpointing.contiguous_memory_optimization needs "
        "activation_checkpointing.number_checkpoints (the number of checkpoints a forward holds)");
  // The count sizes DeepSpeed's contiguous buffer and is read nowhere else: without
  // contiguous_memory_optimization any value (0 included) is ignored, as there.
  if (options.contiguous_memory_optimization && *options.number_checkpoints <= 0)
    throw ConfigError(
        "activation_checkpointing.number_checkpoints must be positive with "
        "activation_checkpointing.contiguous_memory_optimization, got " +
        std::to_string(*options.number_checkpoints));
  // DeepSpeed's configure() asserts the same ("Contiguous Checkpointing is only available with
  // partitioned activations"); it checks this before the count.
  if (options.contiguous_memory_optimization && !options.partition_activations)
    throw ConfigError(
        "activation_checkpointing.contiguous_memory_optimization needs "
        "activation_checkpointing.partition_activations (as in DeepSpeed)");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (options.partition_activations && !has_partition_group() && !r.warned_partition) {
    r.warned_partition = true;
    std::fprintf(
        stderr,
        "[deepspeed] WARNING: activation_checkpointing.partition_activations has no effect "
        "without a model-parallel (tensor-parallel) group; checkpoints are kept whole "
        "(give initialize() a topology with tensor size > 1, or call "
        "checkpointing::set_model_parallel_group)\n");
  }
  r.options = options;
}

void set_model_parallel_group(comm::CommunicatorPtr group) { model_parallel = std::move(group); }
comm::CommunicatorPtr model_parallel_group() { return model_parallel; }

Options options() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.options;
}

Stats stats() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.stats;
}

void reset_stats() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  // Checkpoints alive now stay counted in saved_bytes, so their release balances.
  const int64_t held = r.stats.saved_bytes;
  r.stats = Stats{};
  r.stats.saved_bytes = held;
  r.stats.peak_saved_bytes = held;
}

std::string profile_summary() {
  const Stats s = stats();
  char line[256];
  std::snprintf(line, sizeof line,
                "activation checkpointing: %lld segment forwards, %lld recomputations, forward "
                "%.3f s, recompute %.3f s, peak saved inputs %.1f MiB",
                static_cast<long long>(s.forwards), static_cast<long long>(s.recomputes),
                s.forward_seconds, s.recompute_seconds,
                static_cast<double>(s.peak_saved_bytes) / (1 << 20));
  return line;
}

namespace detail {

void on_saved(int64_t bytes) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const Options& o = r.options;
  if (o.contiguous_memory_optimization && o.number_checkpoints && r.live >= *o.number_checkpoints)
    throw ConfigError("activation_checkpointing.number_checkpoints is " +
                      std::to_string(*o.number_checkpoints) + " but this forward makes checkpoint " +
                      std::to_string(r.live + 1) + "; raise it to the number of checkpointed segments");
  ++r.live;
  ++r.stats.forwards;
  r.stats.saved_bytes += bytes;
  r.stats.peak_saved_bytes = std::max(r.stats.peak_saved_bytes, r.stats.saved_bytes);
}

void on_released(int64_t bytes) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  --r.live;
  r.stats.saved_bytes -= bytes;
}

void add_forward_time(double seconds) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.stats.forward_seconds += seconds;
}

void add_recompute_time(double seconds) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  ++r.stats.recomputes;
  r.stats.recompute_seconds += seconds;
}

}  // namespace detail
}  // namespace checkpointing
}  // namespace deepspeed
