// "auto" is a Hugging Face Trainer / Accelerate convention: that layer fills the value from its
// own arguments before DeepSpeed sees the config. Here ConfigOverrides plays the trainer
// (hf_auto_fill.cpp, batch_size.cpp); an "auto" still left after filling (the batch keys aside,
// which batch_size.cpp resolves or refuses, and the ZeRO size knobs, which keep their defaults)
// is an error listing every one.
#include <string>
#include <vector>

#include "config/blocks.h"
#include "deepspeed/errors.h"

namespace deepspeed::config {
namespace {


// Keys where "auto" is an ordinary value or is handled elsewhere: the ZeRO size knobs keep their
// defaults with a warning (zero_config.cpp), as DeepSpeed drops a leftover "auto" there.
bool auto_allowed(const std::string& path) {
  const std::string zero = "zero_optimization.";
  if (path.compare(0, zero.size(), zero) == 0 &&
      auto_falls_back_to_default(path.substr(zero.size())))
    return true;
  return path == "train_batch_size" || path == "train_micro_batch_size_per_gpu" ||
         path == "gradient_accumulation_steps" || path == "pipeline.stages";
}

void collect(const json& v, const std::string& path, std::vector<std::string>& found) {
  if (is_auto(v) && !auto_allowed(path)) {
    found.push_back(path);
  } else if (v.is_object()) {
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (path.empty() && is_raw_only_block(it.key())) continue;
      collect(it.value(), join_path(path, it.key()), found);
    }
  } else if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i)
      collect(v[i], path + "[" + std::to_string(i) + "]", found);
  }
}

}  // namespace

void reject_unresolved_auto(const json& doc) {
  std::vector<std::string> found;
  collect(doc, "", found);
  if (found.empty()) return;
  std::string list;
  for (const auto& p : found) list += (list.empty() ? "" : ", ") + p;
  throw ConfigError(
      "config keys set to \"auto\" need a value: " + list +
      ". \"auto\" is filled from the values given to initialize() or initialize_pipeline() "
      "(their `overrides`, a ConfigOverrides: the batch sizes, learning_rate, betas, eps, "
      "weight_decay, gradient_clipping, fp16, bf16, warmup_steps, total_steps, hidden_size), as "
      "the Hugging Face integration fills it from the trainer's arguments; pass the value there, "
      "or write the number or setting in the config");
}

}  // namespace deepspeed::config
