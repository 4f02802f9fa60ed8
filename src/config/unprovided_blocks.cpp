// Top-level blocks for features deepspeed.cpp does not provide (apex AMP, W&B, Comet, Nebula, the
// autotuner, the compression library, data efficiency, ...). Each is decided here, once: when
// the block is switched on, either a warning names it and says what happens instead (the run is
// the same run, only a side service is missing), or a ConfigError refuses it (running on would
// silently train something else). The blocks DeepSpeed models with pydantic (wandb, comet,
// hybrid_engine, tensor_parallel, weight_quantization) also get their keys
// checked strictly, as there. The policy table is in docs/config.md.
#include "config/blocks.h"
#include "deepspeed/errors.h"

namespace deepspeed::config {
namespace {

enum class Action { kWarn, kRefuse };

// A block switched on by its "enabled" key, and what deepspeed.cpp does about it.
struct SwitchedBlock {
  const char* key;
  Action action;
  const char* consequence;  // completes "'<key>.enabled' is true: ..."
};

const SwitchedBlock kSwitchedBlocks[] = {
    {"amp", Action::kRefuse,
     "apex AMP (NVIDIA's Python mixed-precision library) has no C++ counterpart, and training in "
     "fp32 instead would silently change the run. Use \"bf16\": {\"enabled\": true} (or \"fp16\") "
     "for mixed precision, or set amp.enabled to false"},
    {"wandb", Action::kWarn,
     "Weights & Biases is not available in deepspeed.cpp (its client is a Python service), so "
     "nothing is sent to W&B; use \"tensorboard\" or \"csv_monitor\" instead (same events); "
     "training is unaffected"},
    {"comet", Action::kWarn,
     "Comet is not available in deepspeed.cpp (its client is a Python service), so nothing is "
     "sent to Comet; use \"tensorboard\" or \"csv_monitor\" instead (same events); training "
     "is unaffected"},
    {"nebula", Action::kWarn,
     "the Azure Nebula checkpoint service has no counterpart here: save_checkpoint() and "
     "load_checkpoint() write and read the directories they are given (persistent_storage_path "
     "and nebula_load_path are not used)"},
    {"autotuning", Action::kWarn,
     "the autotuner is not provided; this run trains with the config exactly as written"},
    {"hybrid_engine", Action::kWarn,
     "the RLHF hybrid engine (generation with inference kernels) is not provided; training is "
     "unaffected"},
    {"progressive_layer_drop", Action::kRefuse,
     "Progressive Layer Drop is not provided, and training every layer on every step would "
     "silently change the run; remove the block or set it to false"},
    {"curriculum_learning", Action::kRefuse,
     "the legacy curriculum learning (sequence-length curriculum) is not provided, and training "
     "on the full data from the start would silently change the run; remove the block or set it "
     "to false"},
    {"elasticity", Action::kRefuse,
     "elastic training is not provided, and the batch size it would choose can differ from the one "
     "written; remove the block or set it to false"},
    {"quantize_training", Action::kRefuse,
     "quantization-aware training (MoQ) is not provided, and training unquantized weights would "
     "silently change the run; remove the block or set it to false"},
};

bool enabled(ObjectReader& block, bool default_value = false) {
  bool on = default_value;
  block.read("enabled", on);
  return on;
}

void act(Warnings& warnings, Action action, const std::string& message) {
  if (action == Action::kRefuse) throw ConfigError(message);
  warnings.add(message);
}

void check_switched_block(ObjectReader& top, const SwitchedBlock& b) {
  if (!top.has(b.key)) return;
  ObjectReader r = top.child(b.key);
  if (enabled(r)) {
    act(top.warnings(), b.action,
        "config key '" + r.path_of("enabled") + "' is true: " + b.consequence);
  }
}

// Pydantic-modelled monitors: their keys are checked like DeepSpeed's models check them.
void check_wandb_keys(ObjectReader& top) {
  ObjectReader r = top.child("wandb");
  std::string s;
  for (const char* k : {"group", "team", "project"}) r.read(k, s);
  r.find("enabled");
  r.finish(UnknownKeys::kError);
}

void check_comet_keys(ObjectReader& top) {
  ObjectReader r = top.child("comet");
  std::string s;
  for (const char* k :
       {"project", "workspace", "api_key", "experiment_name", "experiment_key", "mode"}) {
    r.read(k, s);
  }
  int64_t interval = 0;
  r.read_count("samples_log_interval", interval);
  std::optional<bool> online;
  r.read("online", online);
  r.find("enabled");
  r.finish(UnknownKeys::kError);
}

void check_hybrid_engine_keys(ObjectReader& top) {
  ObjectReader r = top.child("hybrid_engine");
  int64_t count = 0;
  for (const char* k : {"max_out_tokens", "inference_tp_size", "tp_gather_partition_size"}) {
    r.read_count(k, count);
  }
  bool flag = false;
  for (const char* k : {"release_inference_cache", "pin_parameters"}) r.read(k, flag);
  r.find("enabled");
  r.finish(UnknownKeys::kError);
}

// Training AutoTP: keys checked; a tensor-parallel degree above 1 is not provided.
void check_tensor_parallel(ObjectReader& top) {
  ObjectReader r = top.child("tensor_parallel");
  int64_t autotp_size = 0;
  r.read_count("autotp_size", autotp_size);
  std::string dtype;
  r.read("dtype", dtype);
  bool flag = false;
  for (const char* k : {"keep_module_on_host", "replace_with_kernel_inject"}) r.read(k, flag);
  r.find("injection_policy_tuple");
  if (r.has("tp") && r.has("tensor_parallel")) {
    throw ConfigError("config keys '" + r.path_of("tp") + "' and '" + r.path_of("tensor_parallel") +
                      "' are the same setting; give only one");
  }
  ObjectReader tp = r.child(r.has("tensor_parallel") ? "tensor_parallel" : "tp");
  r.find("tp");
  // DeepSpeedTPConfig's switch (default true), which the field's docstring points to; 0.16.5's
  // training TPConfig lacks it and would reject it. Accepted here: training reads nothing of tp
  // either way, and false only says the block is off (no tp_size warning below).
  bool tp_enabled = true;
  tp.read("enabled", tp_enabled);
  int64_t tp_size = 1;
  tp.read_count("tp_size", tp_size);
  int64_t grain = 1;
  tp.read_count("tp_grain_size", grain);
  tp.accept({"mpu", "tp_group"});
  tp.finish(UnknownKeys::kError);
  r.finish(UnknownKeys::kError);
  // DeepSpeed's autotp_size N makes groups of N ranks that read the same samples (the global
  // batch has world / N sequences); read as data parallelism, every rank would read its own and
  // the batch, the loss curve and the learning-rate schedule's meaning would all change.
  if (autotp_size > 1)
    throw ConfigError("config key '" + r.path_of("autotp_size") + "' = " +
                      std::to_string(autotp_size) +
                      ": training AutoTP (splitting an unmodified model from the config) is not "
                      "provided. Build the model from deepspeed::tp's split layers over a "
                      "comm::Topology's tensor_parallel() group and pass that topology as "
                      "InitializeArgs.topology (gpt_train: --tensor_parallel N); see "
                      "docs/tensor_parallel.md. Remove the key");
  // tp is DeepSpeed's TPConfig (the inference config's tensor_parallel block, reused here):
  // training here does not read it, so it changes nothing; said in case one meant autotp_size.
  if (tp_enabled && tp_size > 1) {
    top.warnings().add("config key '" + tp.path_of("tp_size") + "' = " + std::to_string(tp_size) +
                       " is not read by training (every rank holds the whole model as given; "
                       "tensor parallelism goes through InitializeArgs.topology, and "
                       "init_inference takes its own tp_size)");
  }
}

// Post-init weight quantization (an inference feature): keys checked, not applied.
void check_weight_quantization(ObjectReader& top) {
  if (!top.has("weight_quantization")) return;
  ObjectReader r = top.child("weight_quantization");
  bool on = enabled(r, /*default_value=*/true);  // DeepSpeed's WeightQuantConfig default
  int64_t count = 0;
  for (const char* k : {"num_bits", "q_groups"}) r.read_count(k, count);
  std::string q_type;
  r.read("q_type", q_type);
  r.child("quantized_initialization");
  r.child("post_init_quant");
  r.finish(UnknownKeys::kError);
  if (on) {
    top.warnings().add(
        "config block 'weight_quantization' is enabled, but post-initialization "
        "weight quantization (an inference feature) is not provided; weights stay "
        "unquantized");
  }
}

// Compression (quantization, pruning, layer reduction): each technique is switched on by its
// shared_parameters.enabled (layer_reduction: its own enabled).
void check_compression_training(ObjectReader& top) {
  const json* block = top.find("compression_training");
  if (!block) return;
  if (!block->is_object()) fail("compression_training", *block, "a JSON object {...}");
  for (auto it = block->begin(); it != block->end(); ++it) {
    if (!it->is_object()) continue;
    std::string path = join_path("compression_training", it.key());
    std::vector<std::pair<std::string, const json*>> switches;
    if (it->contains("enabled")) switches.push_back({path + ".enabled", &(*it)["enabled"]});
    auto shared = it->find("shared_parameters");
    if (shared != it->end() && shared->is_object() && shared->contains("enabled")) {
      switches.push_back({path + ".shared_parameters.enabled", &(*shared)["enabled"]});
    }
    for (const auto& [key, value] : switches) {
      if (value->is_null() || !to_bool(*value, key)) continue;
      throw ConfigError("config key '" + key +
                        "' is true: the DeepSpeed Compression library (quantization, pruning, "
                        "layer reduction) is not provided, and training the uncompressed model "
                        "would silently change the result; remove the block or set it to false");
    }
  }
}

// Data efficiency: DeepSpeed's engine turns on its curriculum sampler by
// data_sampling.curriculum_learning.enabled and random-LTD by data_routing.random_ltd.enabled,
// whatever data_efficiency.enabled, data_sampling.enabled and data_routing.enabled say (the engine
// does not consult those). Both change what the model trains on, so either inner switch alone is
// refused; the outer switches alone change nothing there, and nothing here.
void check_data_efficiency(ObjectReader& top) {
  if (!top.has("data_efficiency")) return;
  ObjectReader r = top.child("data_efficiency");
  struct Feature {
    const char* block;
    const char* technique;
    const char* what;
  };
  const Feature features[] = {
      {"data_sampling", "curriculum_learning",
       "curriculum learning by data difficulty (DeepSpeed's curriculum data sampler)"},
      {"data_routing", "random_ltd", "random layerwise token dropping (random-LTD)"},
  };
  for (const Feature& f : features) {
    ObjectReader technique = r.child(f.block).child(f.technique);
    if (enabled(technique)) {
      throw ConfigError("config key '" + technique.path_of("enabled") + "' is true: " + f.what +
                        " is not provided, and training without it would silently change the "
                        "run; remove the block or set the key to false");
    }
  }
}

}  // namespace

void read_unprovided_blocks(ObjectReader& top) {
  for (const SwitchedBlock& b : kSwitchedBlocks) check_switched_block(top, b);
  check_wandb_keys(top);
  check_comet_keys(top);
  check_hybrid_engine_keys(top);
  check_tensor_parallel(top);
  check_weight_quantization(top);
  check_compression_training(top);
  check_data_efficiency(top);
  if (top.has("comms_config")) {
    top.warnings().add(
        "config block 'comms_config' is read neither by DeepSpeed 0.16.5 nor by "
        "deepspeed.cpp (collective logging is configured by 'comms_logger'); it is "
        "ignored");
  }
  top.find("comms_config");
}

}  // namespace deepspeed::config
