// "auto" filled as the Hugging Face integration fills it (transformers.integrations.deepspeed,
// HfTrainerDeepSpeedConfig.trainer_config_process / trainer_config_finalize): each rule is HF's
// fill_match (an "auto" key takes the trainer's value; an explicit one must agree with it) or
// fill_only (an "auto" key takes the value; an explicit one is kept). The batch triple is filled
// by batch_size.cpp, which also derives the third key; everything else is here.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "config/blocks.h"
#include "deepspeed/errors.h"

namespace deepspeed::config {
namespace {


// Values compare as numbers where both read as numbers (the config may write "5e8" or "true"),
// element by element for lists, and as JSON otherwise.
bool same_value(const json& config_value, const json& given) {
  if (config_value.is_array() && given.is_array()) {
    if (config_value.size() != given.size()) return false;
    for (size_t i = 0; i < given.size(); ++i)
      if (!same_value(config_value[i], given[i])) return false;
    return true;
  }
  try {
    if (given.is_boolean()) return to_bool(config_value, "") == given.get<bool>();
    if (given.is_number()) {
      double a = to_double(config_value, ""), b = given.get<double>();
      return a == b || std::abs(a - b) <= 1e-12 * std::max(std::abs(a), std::abs(b));
    }
  } catch (const ConfigError&) {
    return true;  // not a number at all: the block's reader reports the type error
  }
  return config_value == given;
}

class Filler {
 public:
  Filler(json& doc, const ConfigOverrides& over, AutoFillResult& out)
      : doc_(doc), over_(over), out_(out) {}

  // HF fill_match: only keys present in the config are touched.
  template <class T>
  void match(const std::string& path, const std::optional<T>& value, const char* given_as) {
    if (!value) return;
    json* v = find(path);
    if (!v) return;
    json given = *value;
    if (is_auto(*v)) return fill(path, *v, given);
    if (!over_.fill_only && !same_value(*v, given))
      out_.mismatches.push_back(path + " = " + describe(*v) + " but initialize() was given " +
                                given_as + " = " + given.dump());
  }

  // HF fill_only.
  template <class T>
  void only(const std::string& path, const std::optional<T>& value) {
    if (!value) return;
    json* v = find(path);
    if (v && is_auto(*v)) fill(path, *v, json(*value));
  }

 private:
  // The value at a dotted path, nullptr where a step is missing or not an object.
  json* find(const std::string& path) {
    json* node = &doc_;
    size_t begin = 0;
    while (true) {
      size_t dot = path.find('.', begin);
      std::string key = path.substr(begin, dot == std::string::npos ? dot : dot - begin);
      if (!node->is_object()) return nullptr;
      auto it = node->find(key);
      if (it == node->end()) return nullptr;
      node = &*it;
      if (dot == std::string::npos) return node;
      begin = dot + 1;
    }
  }
  void fill(const std::string& path, json& slot, json value) {
    slot = value;
    out_.filled.emplace_back(path, std::move(value));
  }

  json& doc_;
  const ConfigOverrides& over_;
  AutoFillResult& out_;
};

template <class T>
std::optional<T> when(bool given, T value) {
  return given ? std::optional<T>(value) : std::nullopt;
}

}  // namespace

AutoFillResult fill_auto_values(json& doc, const ConfigOverrides& over) {
  AutoFillResult out;
  if (!doc.is_object()) return out;
  Filler f(doc, over, out);
  f.match("gradient_clipping", over.gradient_clipping, "gradient_clipping");

  f.match("optimizer.params.lr", over.learning_rate, "learning_rate");
  std::optional<std::vector<double>> betas;
  if (over.betas) betas = std::vector<double>{over.betas->first, over.betas->second};
  f.match("optimizer.params.betas", betas, "betas");
  f.match("optimizer.params.eps", over.eps, "eps");
  f.match("optimizer.params.weight_decay", over.weight_decay, "weight_decay");

  // HF's trainer schedule warms up from 0 (a trainer constant, written when a trainer is there:
  // here, when the learning rate is given).
  f.only("scheduler.params.warmup_min_lr", when(over.learning_rate.has_value(), 0));
  f.match("scheduler.params.warmup_max_lr", over.learning_rate, "learning_rate");
  f.match("scheduler.params.warmup_num_steps", over.warmup_steps, "warmup_steps");
  f.match("scheduler.params.total_num_steps", over.total_steps, "total_steps");

  f.match("fp16.enabled", over.fp16, "fp16");
  f.match("bf16.enabled", over.bf16, "bf16");
  f.match("bfloat16.enabled", over.bf16, "bf16");
  // HF: amp.enabled = (fp16_backend == "apex"). No trainer here runs apex (deepspeed.cpp has no
  // apex, and an enabled amp block is refused), so "auto" is false whatever the overrides say;
  // fp16 from the trainer is PyTorch's native AMP, filled into fp16.enabled above. HF's
  // amp.opt_level (fp16_opt_level) has no ConfigOverrides field: with amp off it is unused and is
  // left as written (amp is kept only in raw, so its "auto" is not refused).
  f.only("amp.enabled", std::optional<bool>(false));

  // HF derives these from the model's hidden size. It fills the stage3_* keys at stage 3 only
  // (below stage 3 DeepSpeed then drops the "auto" and uses its default); here they are filled at
  // every stage, where they have no effect below stage 3 either.
  if (over.hidden_size) {
    const int64_t h = *over.hidden_size;
    if (h <= 0)
      throw ConfigError("initialize() was given hidden_size = " + std::to_string(h) +
                        "; expected a positive integer");
    f.only("zero_optimization.reduce_bucket_size", std::optional<int64_t>(h * h));
    f.only("zero_optimization.stage3_prefetch_bucket_size",
           std::optional<int64_t>(static_cast<int64_t>(0.9 * double(h) * double(h))));
    f.only("zero_optimization.stage3_param_persistence_threshold", std::optional<int64_t>(10 * h));
  }
  return out;
}

void reject_auto_mismatches(const AutoFillResult& result) {
  if (result.mismatches.empty()) return;
  std::string list;
  for (const auto& m : result.mismatches) list += "\n  - " + m;
  throw ConfigError(
      "config values disagree with the values given to initialize() "
      "(ConfigOverrides):" +
      list +
      "\nmake them agree, or write \"auto\" in the config to take initialize()'s "
      "value (or set ConfigOverrides.fill_only to keep the config's)");
}

}  // namespace deepspeed::config
