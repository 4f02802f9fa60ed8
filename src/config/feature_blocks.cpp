// Blocks for features built in later releases: read and checked now so that a config that uses
// them fails early on a typo, not when the feature arrives.
#include <cctype>

#include "config/blocks.h"
#include "deepspeed/errors.h"
#include "monitor/comm_op_names.h"
#include "offload/aio_queue.h"
#include "offload/aligned_buffer.h"

namespace deepspeed::config {
namespace {

void read_aio(ObjectReader& top, AioConfig& aio) {
  ObjectReader r = top.child("aio");
  r.read_count("block_size", aio.block_size);
  r.read_count("queue_depth", aio.queue_depth);
  // The docs call it thread_count; DeepSpeed's code reads intra_op_parallelism.
  r.find("thread_count");
  if (r.has("thread_count") && r.has("intra_op_parallelism")) {
    throw ConfigError(
        "config keys 'aio.thread_count' and 'aio.intra_op_parallelism' are the same "
        "setting; give only one");
  }
  const char* threads = r.has("thread_count") ? "thread_count" : "intra_op_parallelism";
  if (r.has("thread_count")) {
    r.warnings().add("config key 'aio.thread_count' is deprecated; use 'aio.intra_op_parallelism'");
  }
  r.read_count(threads, aio.intra_op_parallelism);
  r.find("intra_op_parallelism");
  r.read("single_submit", aio.single_submit);
  r.read("overlap_events", aio.overlap_events);
  r.read("use_gds", aio.use_gds);
  // DeepSpeed 0.16.5 reads aio with dict lookups; we check it strictly all the same: these keys
  // size the NVMe swap I/O, and a misspelt one would silently run with the default.
  r.finish(UnknownKeys::kError);
  // One block is one direct (O_DIRECT) read or write: page-aligned, and within what one
  // io_uring request can carry (the kernel cuts a request at 0x7ffff000 bytes; a larger block
  // would fail at the first swap as a short read).
  if (aio.block_size <= 0 || aio.block_size % offload::kDirectIoAlignment != 0 ||
      aio.block_size > offload::kMaxAioBlockSize)
    fail(r.path_of("block_size"), aio.block_size,
         "a positive multiple of " + std::to_string(offload::kDirectIoAlignment) +
             " bytes, at most " + std::to_string(offload::kMaxAioBlockSize) + " (1 GiB)");
  require_positive(r.path_of("queue_depth"), static_cast<double>(aio.queue_depth));
  require_positive(r.path_of(threads), static_cast<double>(aio.intra_op_parallelism));
}

void read_activation_checkpointing(ObjectReader& top, ActivationCheckpointingConfig& ac) {
  ObjectReader r = top.child("activation_checkpointing");
  r.read("partition_activations", ac.partition_activations);
  r.read("cpu_checkpointing", ac.cpu_checkpointing);
  r.read("contiguous_memory_optimization", ac.contiguous_memory_optimization);
  // Some configs write false for "no count"; DeepSpeed treats it as None. The count sizes
  // DeepSpeed's contiguous checkpoint buffer and is read nowhere else: without
  // contiguous_memory_optimization any count (0 too) is ignored; with it, it must be >= 1.
  if (const json* v = r.find("number_checkpoints"); v && !(v->is_boolean() && !v->get<bool>())) {
    ac.number_checkpoints = to_int64(*v, r.path_of("number_checkpoints"));
    require_at_least(r.path_of("number_checkpoints"), *ac.number_checkpoints, 0);
    if (ac.contiguous_memory_optimization && *ac.number_checkpoints < 1) {
      fail(r.path_of("number_checkpoints"), *v,
           "a count >= 1 with " + r.path_of("contiguous_memory_optimization") +
               " (the number of checkpoints a forward holds)");
    }
  }
  r.read("synchronize_checkpoint_boundary", ac.synchronize_checkpoint_boundary);
  r.read("profile", ac.profile);
  r.finish();
}

void read_pipeline(ObjectReader& top, PipelineConfig& pipe) {
  ObjectReader r = top.child("pipeline");
  // "auto" or a stage count.
  if (const json* v = r.find("stages")) {
    const std::optional<int64_t> count = pipeline_stage_count(*v, r.path_of("stages"));
    pipe.stages = count ? std::to_string(*count) : "auto";
  }
  r.read("partition", pipe.partition);
  r.read("seed_layers", pipe.seed_layers);
  r.read_count("activation_checkpoint_interval", pipe.activation_checkpoint_interval);
  r.read("pipe_partitioned", pipe.pipe_partitioned);
  r.read("grad_partitioned", pipe.grad_partitioned);
  bool use_reentrant = true;
  r.read("use_reentrant", use_reentrant);
  r.finish();
}

void read_flops_profiler(ObjectReader& top, FlopsProfilerConfig& fp) {
  ObjectReader r = top.child("flops_profiler");
  r.read("enabled", fp.enabled);
  r.read_count("profile_step", fp.profile_step);
  r.read("module_depth", fp.module_depth);
  r.read("top_modules", fp.top_modules);
  r.read("detailed", fp.detailed);
  r.read("output_file", fp.output_file);
  r.read("recompute_fwd_factor", fp.recompute_fwd_factor);
  r.read("peak_tflops", fp.peak_tflops);  // deepspeed.cpp extension
  r.finish();
  require_at_least(r.path_of("module_depth"), static_cast<double>(fp.module_depth), -1);
  require_at_least(r.path_of("top_modules"), static_cast<double>(fp.top_modules), 1);
  require_at_least(r.path_of("recompute_fwd_factor"), fp.recompute_fwd_factor, 0);
  require_at_least(r.path_of("peak_tflops"), fp.peak_tflops, 0);
}

void read_monitor(ObjectReader& top, const std::string& key, MonitorConfig& m) {
  ObjectReader r = top.child(key);
  r.read("enabled", m.enabled);
  r.read("output_path", m.output_path);
  r.read("job_name", m.job_name);
  r.finish(UnknownKeys::kError);  // pydantic in DeepSpeed
}

void read_checkpoint(ObjectReader& top, CheckpointConfig& ck) {
  ObjectReader r = top.child("checkpoint");
  if (const json* v = r.find("tag_validation")) {
    std::string s = ascii_lower(to_string(*v, r.path_of("tag_validation")));
    if (s == "ignore" || s == "warn" || s == "fail") {
      s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
      ck.tag_validation = s;  // canonical spelling: Ignore, Warn, Fail
    } else {
      fail(r.path_of("tag_validation"), *v, "one of \"Ignore\", \"Warn\", \"Fail\"");
    }
  }
  r.read("load_universal", ck.load_universal);
  r.read("use_node_local_storage", ck.use_node_local_storage);
  // Accepted so DeepSpeed configs load, but they change nothing here: say so instead of letting
  // a job believe it runs as under DeepSpeed.
  if (ck.load_universal)
    r.warnings().add(
        "config key 'checkpoint.load_universal' is true but not used: DeepSpeed then loads a "
        "universal checkpoint (the tag in 'latest_universal'); here load_checkpoint reads "
        "'latest' and every checkpoint reshards itself to the new world size and stage");
  if (ck.use_node_local_storage)
    r.warnings().add(
        "config key 'checkpoint.use_node_local_storage' is true but not used: DeepSpeed then "
        "has every node's local rank 0 write the model-states file and 'latest' to that node's own "
        "storage; here rank 0 writes them once, so save_dir must be a folder every rank shares");
  ObjectReader pw = r.child("parallel_write");
  pw.read("pipeline_stage", ck.parallel_write_pipeline_stage);
  pw.finish();
  r.finish();
}

void read_comms_logger(ObjectReader& top, CommsLoggerConfig& cl) {
  ObjectReader r = top.child("comms_logger");
  r.read("enabled", cl.enabled);
  r.read("verbose", cl.verbose);
  r.read("prof_all", cl.prof_all);
  r.read("debug", cl.debug);
  if (const json* v = r.find("prof_ops")) {
    if (!v->is_array()) fail(r.path_of("prof_ops"), *v, "a list of collective names");
    for (size_t i = 0; i < v->size(); ++i) {
      const std::string path = r.path_of("prof_ops") + "[" + std::to_string(i) + "]";
      const std::string name = to_string((*v)[i], path);
      // DeepSpeed's names select ours (monitor/comm_op_names.h); one that selects nothing warns.
      if (monitor::recorded_ops_named(name).empty())
        r.warnings().add(monitor::prof_op_selects_nothing(path, name));
    }
  }
  r.finish(UnknownKeys::kError);  // pydantic in DeepSpeed
}

// DeepSpeed models only timers.throughput (pydantic: strict); other keys under timers are never
// read there (lenient: warned about).
void read_timers(ObjectReader& top, ThroughputTimerConfig& tt) {
  ObjectReader timers = top.child("timers");
  ObjectReader r = timers.child("throughput");
  r.read("enabled", tt.enabled);
  r.read("synchronized", tt.synchronized);
  r.finish(UnknownKeys::kError);
  timers.finish();
}

}  // namespace

std::optional<int64_t> pipeline_stage_count(const json& value, const std::string& path) {
  if (value.is_string() && value.get<std::string>() == "auto") return std::nullopt;
  std::optional<int64_t> count;
  try {
    count = to_int64(value, path);
  } catch (const ConfigError&) {
    // reported below, with "auto" among the forms expected
  }
  if (!count || *count < 1) fail(path, value, "\"auto\" or a positive number of stages");
  return count;
}

void read_feature_blocks(ObjectReader& top, Config& cfg) {
  read_aio(top, cfg.aio);
  read_activation_checkpointing(top, cfg.activation_checkpointing);
  read_pipeline(top, cfg.pipeline);
  read_flops_profiler(top, cfg.flops_profiler);
  read_monitor(top, "tensorboard", cfg.tensorboard);
  read_monitor(top, "csv_monitor", cfg.csv_monitor);
  read_checkpoint(top, cfg.checkpoint);
  read_comms_logger(top, cfg.comms_logger);
  read_timers(top, cfg.throughput_timer);
}

}  // namespace deepspeed::config
