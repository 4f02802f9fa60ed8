// zero_optimization: every key of DeepSpeed's DeepSpeedZeroConfig, its aliases and deprecated
// spellings, and the legacy boolean form.
#include <vector>

#include "config/blocks.h"
#include "deepspeed/errors.h"

namespace deepspeed::config {
namespace {

const char* kZero = "zero_optimization";

// Another name DeepSpeed accepts for a key: the stage3_ prefix is optional there, and a few old
// spellings are deprecated.
struct Alias {
  const char* name;
  bool deprecated;
};

// Reads `key` or one of its aliases; two spellings given at once are ambiguous, so an error.
template <typename T>
void read_aliased(ObjectReader& r, const std::string& key, std::vector<Alias> aliases, T& out) {
  r.find(key);
  std::string given = r.has(key) ? key : "";
  bool deprecated = false;
  for (const Alias& a : aliases) {
    r.find(a.name);
    if (!r.has(a.name)) continue;
    if (!given.empty()) {
      throw ConfigError("config keys '" + r.path_of(given) + "' and '" + r.path_of(a.name) +
                        "' are the same setting; give only one");
    }
    given = a.name;
    deprecated = a.deprecated;
  }
  if (given.empty() || given == key) {
    r.read(key, out);
    return;
  }
  r.warnings().add("config key '" + r.path_of(given) + "' is " +
                   (deprecated ? "deprecated; use '" : "read as '") + r.path_of(key) + "'");
  r.read(given, out);
}

// DeepSpeed's pydantic ZeRO model drops every field whose value is "auto" before validating
// (DeepSpeedConfigModel.__init__), so the field keeps its default; OpenRLHF, TRL and Accelerate
// pass these sizes as "auto" straight to deepspeed.initialize. They tune speed and memory, not
// what is trained, so here too the default stands, with a warning. When ConfigOverrides
// carries hidden_size the first three were already filled as Hugging Face fills them. True when
// `key` (or `alias`) was such an "auto": `out` keeps its default.
bool leftover_auto(ObjectReader& r, const std::string& key, const char* alias, int64_t out) {
  if (alias && r.has(key) && r.has(alias)) return false;  // read_aliased refuses the pair
  const std::string given = alias && r.has(alias) ? alias : key;
  const json* v = r.find(given);
  if (!v || !is_auto(*v)) return false;
  // The spellings hf_auto_fill.cpp fills from the hidden size, as Hugging Face does.
  const bool from_hidden = given == "reduce_bucket_size" ||
                           given == "stage3_prefetch_bucket_size" ||
                           given == "stage3_param_persistence_threshold";
  r.warnings().add("config key '" + r.path_of(given) + "' is \"auto\" with nothing to fill it; " +
                   "using the default " + std::to_string(out) +
                   ", as DeepSpeed does with a leftover \"auto\"" +
                   (from_hidden ? " (ConfigOverrides::hidden_size fills it as Hugging Face does)"
                                : ""));
  return true;
}

void read_size(ObjectReader& r, const std::string& key, int64_t& out) {
  if (!leftover_auto(r, key, nullptr, out)) r.read_count(key, out);
}

void read_aliased_count(ObjectReader& r, const std::string& key, const char* alias, int64_t& out) {
  read_aliased(r, key, {{alias, false}}, out);
  require_at_least(r.path_of(r.has(alias) ? alias : key), static_cast<double>(out), 0);
}

void read_aliased_size(ObjectReader& r, const std::string& key, const char* alias, int64_t& out) {
  if (!leftover_auto(r, key, alias, out)) read_aliased_count(r, key, alias, out);
}

// cpu_offload / cpu_offload_param: true means {"device": "cpu"} for the new block.
void read_deprecated_offload(ObjectReader& r, const std::string& old_key,
                             const std::string& new_key, OffloadConfig& block) {
  if (!r.has(old_key)) {
    r.find(old_key);
    return;
  }
  bool on = false;
  r.read(old_key, on);
  r.warnings().add("config key '" + r.path_of(old_key) + "' is deprecated; use '" +
                   r.path_of(new_key) + "': {\"device\": \"cpu\"}");
  if (on && r.has(new_key)) {
    throw ConfigError("config keys '" + r.path_of(old_key) + "' and '" + r.path_of(new_key) +
                      "' are both given; keep only '" + r.path_of(new_key) + "'");
  }
  if (on) block.device = "cpu";
}

void read_buckets(ObjectReader& r, ZeroConfig& z) {
  r.read("contiguous_gradients", z.contiguous_gradients);
  r.read("reduce_scatter", z.reduce_scatter);
  read_size(r, "reduce_bucket_size", z.reduce_bucket_size);
  r.read("use_multi_rank_bucket_allreduce", z.use_multi_rank_bucket_allreduce);
  r.read("allgather_partitions", z.allgather_partitions);
  read_size(r, "allgather_bucket_size", z.allgather_bucket_size);
  // 0 would all-gather one element at a time (DeepSpeed divides by it: ZeroDivisionError).
  if (z.allgather_bucket_size <= 0)
    fail(r.path_of("allgather_bucket_size"), z.allgather_bucket_size, "a value > 0");
  r.read("overlap_comm", z.overlap_comm);
  r.read("load_from_fp32_weights", z.load_from_fp32_weights);
  r.read("elastic_checkpoint", z.elastic_checkpoint);
  r.read("ignore_unused_parameters", z.ignore_unused_parameters);
  r.read("round_robin_gradients", z.round_robin_gradients);
  r.read("release_gradients", z.release_gradients);  // deepspeed.cpp's own key
  r.read("overlap_param_gather", z.overlap_param_gather);  // deepspeed.cpp's own key
  read_size(r, "sub_group_size", z.sub_group_size);
  require_positive(r.path_of("sub_group_size"), static_cast<double>(z.sub_group_size));
}

// zero_optimization.leaf_module: lists of strings; one string stands for a list of one, as
// DeepSpeed's validator coerces it. Strict, as DeepSpeed's pydantic model.
void read_leaf_modules(ObjectReader& r, LeafModuleConfig& leaf) {
  ObjectReader l = r.child("leaf_module");
  auto list = [&l](const char* key, std::vector<std::string>& out) {
    const json* v = l.find(key);
    if (!v) return;
    if (v->is_string()) {
      out = {v->get<std::string>()};
      return;
    }
    if (!v->is_array()) fail(l.path_of(key), *v, "a list of strings (or one string)");
    out.clear();
    for (size_t i = 0; i < v->size(); ++i)
      out.push_back(to_string((*v)[i], l.path_of(key) + "[" + std::to_string(i) + "]"));
  };
  list("classes", leaf.classes);
  list("names", leaf.names);
  list("name_suffixes", leaf.name_suffixes);
  l.finish(UnknownKeys::kError);
}

void read_stage3(ObjectReader& r, ZeroConfig& z) {
  read_aliased_size(r, "stage3_prefetch_bucket_size", "prefetch_bucket_size",
                     z.stage3_prefetch_bucket_size);
  read_aliased_size(r, "stage3_param_persistence_threshold", "param_persistence_threshold",
                     z.stage3_param_persistence_threshold);
  read_aliased_size(r, "stage3_model_persistence_threshold", "model_persistence_threshold",
                     z.stage3_model_persistence_threshold);
  read_aliased_size(r, "stage3_max_live_parameters", "max_live_parameters",
                     z.stage3_max_live_parameters);
  read_aliased_size(r, "stage3_max_reuse_distance", "max_reuse_distance",
                     z.stage3_max_reuse_distance);
  // The fp16 spelling predates bf16 support; DeepSpeed remaps it with a warning.
  read_aliased(r, "stage3_gather_16bit_weights_on_model_save",
               {{"gather_16bit_weights_on_model_save", false},
                {"stage3_gather_fp16_weights_on_model_save", true}},
               z.stage3_gather_16bit_weights_on_model_save);
  read_aliased_count(r, "stage3_module_granularity_threshold", "module_granularity_threshold",
                     z.stage3_module_granularity_threshold);
  read_leaf_modules(r, z.leaf_module);
  bool all_reduce_fetch = false;
  read_aliased(r, "stage3_use_all_reduce_for_fetch_params",
               {{"use_all_reduce_for_fetch_params", false}}, all_reduce_fetch);
}

// ZeRO++ (zero/stage3/zeropp_options.h resolves hpz against the world size). DeepSpeed passes
// these to its stage-3 optimizer only: at stages 0-2 they are ignored, and said so.
void read_zeropp(ObjectReader& r, ZeroConfig& z) {
  r.read("zero_quantized_weights", z.zero_quantized_weights);
  r.read("zero_quantized_gradients", z.zero_quantized_gradients);
  // DeepSpeed: Field(1, ge=0); its stage 3 makes the secondary group only when the size is > 1,
  // so 0 is off as 1 is.
  r.read_count("zero_hpz_partition_size", z.zero_hpz_partition_size);
  if (z.zero_hpz_partition_size == 0) z.zero_hpz_partition_size = 1;
  if (z.stage == 3) return;
  const std::string stage = std::to_string(z.stage);
  auto ignore = [&](const char* key, bool on) {
    if (on) r.warnings().add("config key '" + r.path_of(key) +
                             "' (ZeRO++) applies to stage 3 only; ignored at stage " + stage);
  };
  ignore("zero_quantized_weights", z.zero_quantized_weights);
  ignore("zero_quantized_gradients", z.zero_quantized_gradients);
  ignore("zero_hpz_partition_size", z.zero_hpz_partition_size > 1);
  z.zero_quantized_weights = z.zero_quantized_gradients = false;
  z.zero_hpz_partition_size = 1;
}

// Keys of MiCS and DeepSpeed internals (and ZeRO++'s frozen-weight storage and LoCo):
// type-checked, kept only in raw. The internals change nothing a user sees; the features are not
// implemented, so turning one on gets a warning that names it instead of silence.
void read_extensions(ObjectReader& r) {
  for (const char* k : {"memory_efficient_linear", "pipeline_loading_checkpoint",
                        "override_module_apply", "log_trace_cache_warnings"}) {
    bool flag = false;
    r.read(k, flag);
  }
  auto not_implemented = [&r](const std::string& key, const std::string& what) {
    r.warnings().add("config key '" + r.path_of(key) + "': " + what +
                     " is not implemented; ignored");
  };
  bool quantized_frozen = false, mics_hierarchical = false;
  r.read("zero_quantized_nontrainable_weights", quantized_frozen);
  if (quantized_frozen)
    not_implemented("zero_quantized_nontrainable_weights",
                    "ZeRO++'s quantized storage of frozen weights (they stay in their own dtype)");
  r.read("mics_hierarchical_params_gather", mics_hierarchical);
  if (mics_hierarchical) not_implemented("mics_hierarchical_params_gather", "MiCS");
  int64_t mics = -1;
  r.read("mics_shard_size", mics);
  if (mics > 0)
    not_implemented("mics_shard_size",
                    "MiCS (sharding within groups of " + std::to_string(mics) +
                        " ranks); ZeRO-3 shards over the whole data-parallel group");
  r.child("zeropp_loco_param");  // an object, {err_beta, reset_T}: contents not checked
  if (const json* loco = r.find("zeropp_loco_param"); loco && !loco->empty())
    not_implemented("zeropp_loco_param",
                    "LoCo (error feedback for qgZ's quantized gradients); qgZ runs without it");
  bool legacy_stage1 = false;
  r.read("legacy_stage1", legacy_stage1);
  if (legacy_stage1) {
    throw ConfigError("config key '" + r.path_of("legacy_stage1") +
                      "' is true, but the legacy stage-1 implementation was removed from "
                      "DeepSpeed and is not provided; remove the key");
  }
}

void read_zero_object(ObjectReader& r, ZeroConfig& z) {
  r.read("stage", z.stage);
  if (z.stage < 0 || z.stage > 3) fail(r.path_of("stage"), z.stage, "0, 1, 2 or 3");
  read_buckets(r, z);
  read_offload(r, "offload_param", /*is_param=*/true, z.offload_param);
  read_offload(r, "offload_optimizer", /*is_param=*/false, z.offload_optimizer);
  read_deprecated_offload(r, "cpu_offload", "offload_optimizer", z.offload_optimizer);
  read_deprecated_offload(r, "cpu_offload_param", "offload_param", z.offload_param);
  // DeepSpeed 0.16.5 declares it deprecated with set_new_param False: it warns and sets nothing.
  if (r.has("cpu_offload_use_pin_memory")) {
    bool pin = false;
    r.read("cpu_offload_use_pin_memory", pin);  // type-checked: Optional[bool] there
    r.warnings().add("config key '" + r.path_of("cpu_offload_use_pin_memory") +
                     "' is deprecated and has no effect (as in DeepSpeed); use '" +
                     r.path_of("offload_param.pin_memory") + "' / '" +
                     r.path_of("offload_optimizer.pin_memory") + "'");
  }
  r.accept({"cpu_offload_use_pin_memory"});
  read_stage3(r, z);
  read_zeropp(r, z);
  read_extensions(r);
  r.finish(UnknownKeys::kError);  // pydantic in DeepSpeed: a typo here costs a memory setting
}

}  // namespace

bool auto_falls_back_to_default(const std::string& zero_key) {
  static const char* const kKeys[] = {
      "reduce_bucket_size",          "allgather_bucket_size",
      "sub_group_size",              "stage3_prefetch_bucket_size",
      "prefetch_bucket_size",        "stage3_param_persistence_threshold",
      "param_persistence_threshold", "stage3_model_persistence_threshold",
      "model_persistence_threshold", "stage3_max_live_parameters",
      "max_live_parameters",         "stage3_max_reuse_distance",
      "max_reuse_distance"};
  for (const char* k : kKeys)
    if (zero_key == k) return true;
  return false;
}

void read_zero(ObjectReader& top, Config& cfg) {
  ZeroConfig& z = cfg.zero_optimization;
  z.offload_param.buffer_count = 5;  // DeepSpeed's offload_param default; offload_optimizer: 4
  const json* v = top.find(kZero);
  if (v && v->is_boolean()) {
    // Legacy form: true meant stage 1, with the bucket size from top-level "allgather_size".
    top.warnings().add(
        "config key 'zero_optimization' as a boolean is deprecated; use "
        "{\"stage\": 1}");
    z.stage = v->get<bool>() ? 1 : 0;
    top.read_count("allgather_size", z.allgather_bucket_size);
    if (z.allgather_bucket_size <= 0)
      fail(top.path_of("allgather_size"), z.allgather_bucket_size, "a value > 0");
    return;
  }
  ObjectReader r = top.child(kZero);
  read_zero_object(r, z);
  validate_offload(kZero, z, top.warnings());
  if (z.overlap_param_gather && (z.stage == 0 || z.stage == 3)) {
    top.warnings().add(std::string(kZero) + ".overlap_param_gather applies to stages 1 and 2; "
                       "ignored at stage " + std::to_string(z.stage) +
                       (z.stage == 0 ? " (nothing is gathered after the step)"
                                     : " (its units are gathered in the forward already)"));
    z.overlap_param_gather = false;
  }
}

}  // namespace deepspeed::config
