// Per-layer weights of the pipeline.partition methods and the printed partition
// (partition_method.h).
#include "pipe/partition_method.h"

#include <cstdio>
#include <regex>

#include "deepspeed/errors.h"
#include "pipe/stage_module.h"
#include "util/ascii.h"

namespace deepspeed {
namespace pipe {

namespace {

int64_t trainable_numel(const torch::nn::AnyModule& m) {
  if (m.is_empty()) return 0;
  int64_t n = 0;
  for (auto& p : m.ptr()->parameters())
    if (p.requires_grad()) n += p.numel();
  return n;
}

}  // namespace

std::string normalized_partition_method(const std::string& method) {
  const std::string lowered = ascii_lower(method);
  if (lowered.rfind("type:", 0) == 0) return "type:" + method.substr(5);
  return lowered == "best" ? "parameters" : lowered;
}

// Per-layer weights for the partition method, and the layers built to count them.
std::vector<int64_t> layer_weights(const std::vector<LayerSpec>& specs, const std::string& method,
                                   const std::string& key, uint64_t seed,
                                   std::map<size_t, torch::nn::AnyModule>& built) {
  std::vector<int64_t> w(specs.size(), 1);
  if (method == "uniform") return w;
  const bool by_type = method.rfind("type:", 0) == 0;
  if (!by_type && method != "parameters")
    throw ConfigError(key + " = \"" + method +
                      "\": expected \"parameters\", \"uniform\" or \"type:<regex>\"");
  std::regex pattern;
  if (by_type) {
    try {
      pattern = std::regex(method.substr(5), std::regex::icase);
    } catch (const std::regex_error& e) {
      throw ConfigError(key + " = \"" + method + "\": bad regular expression: " + e.what());
    }
  }
  std::map<std::string, size_t> first_of_key;
  bool matched = false;
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& key = specs[i].tied_key;
    torch::nn::AnyModule m;
    if (!key.empty() && first_of_key.count(key))
      m = built[first_of_key[key]];
    else
      m = build_layer(specs, i, seed);
    if (!key.empty()) first_of_key.emplace(key, i);
    built[i] = m;
    if (by_type) {
      w[i] = std::regex_search(layer_type_name(specs[i], m), pattern) ? 1 : 0;
      matched = matched || w[i] == 1;
    } else {
      w[i] = trainable_numel(m);
    }
  }
  if (by_type && !matched) {
    std::string names;
    for (size_t i = 0; i < specs.size(); ++i)
      names += (i ? ", " : "") + layer_type_name(specs[i], built[i]);
    throw ConfigError(key + " = \"" + method + "\": no layer's type matches (types: " +
                      names + ")");
  }
  return w;
}

void print_partition(const std::vector<LayerSpec>& specs, const Partition& p,
                     const std::string& method) {
  std::printf("pipeline: %zu layers on %zu stages (partition \"%s\")\n", specs.size(),
              p.bounds.size() - 1, method.c_str());
  for (size_t s = 0; s + 1 < p.bounds.size(); ++s) {
    std::printf("  stage %zu: layers %lld-%lld (", s, static_cast<long long>(p.bounds[s]),
                static_cast<long long>(p.bounds[s + 1] - 1));
    for (int64_t i = p.bounds[s]; i < p.bounds[s + 1]; ++i)
      std::printf("%s%s", i > p.bounds[s] ? ", " : "", specs[i].name.c_str());
    std::printf("), %lld parameters\n", static_cast<long long>(p.parameters[s]));
  }
  std::fflush(stdout);
}

}  // namespace pipe
}  // namespace deepspeed
