#include "zero/stage3/unit_layout.h"

#include <algorithm>
#include <functional>

#include <c10/util/accumulate.h>
#include <unordered_map>
#include <unordered_set>

#include "zero/stage3/init_shard.h"

namespace deepspeed {
namespace zero {
namespace {
using Key = const void*;
Key key(const at::Tensor& t) { return t.unsafeGetTensorImpl(); }

// For each parameter, the index (1-based) of the innermost unit holding it, or 0 (root) when it
// lies outside every unit or in two units neither of which contains the other.
std::unordered_map<Key, int> owners(const std::vector<ZeroUnitBase*>& units) {
  std::vector<std::unordered_set<Key>> params(units.size());
  for (size_t u = 0; u < units.size(); ++u)
    for (auto& p : units[u]->parameters()) params[u].insert(key(p));
  auto contains = [&](size_t outer, size_t inner) {
    for (auto& m : units[outer]->modules(/*include_self=*/false))
      if (m.get() == units[inner]) return true;
    return false;
  };
  std::unordered_map<Key, std::vector<size_t>> holders;
  for (size_t u = 0; u < units.size(); ++u)
    for (Key k : params[u]) holders[k].push_back(u);
  std::unordered_map<Key, int> owner;
  for (auto& [k, hs] : holders) {
    std::vector<size_t> innermost;
    for (size_t a : hs) {
      bool has_inner = false;
      for (size_t b : hs) has_inner = has_inner || (a != b && contains(a, b));
      if (!has_inner) innermost.push_back(a);
    }
    owner[k] = innermost.size() == 1 ? static_cast<int>(innermost[0]) + 1 : 0;
  }
  return owner;
}
}  // namespace

std::vector<ZeroUnitBase*> find_units(torch::nn::Module& model) {
  std::vector<ZeroUnitBase*> units;
  auto visit = [&](torch::nn::Module& m) {
    auto* u = dynamic_cast<ZeroUnitBase*>(&m);
    if (u && std::find(units.begin(), units.end(), u) == units.end()) units.push_back(u);
  };
  visit(model);
  for (auto& m : model.modules(/*include_self=*/false)) visit(*m);
  return units;
}

std::unordered_set<const c10::TensorImpl*> parameters_outside_units(torch::nn::Module& model) {
  std::unordered_set<const c10::TensorImpl*> out;
  std::function<void(torch::nn::Module&)> visit = [&](torch::nn::Module& m) {
    if (dynamic_cast<ZeroUnitBase*>(&m) != nullptr) return;  // a unit and all under it
    for (const auto& p : m.parameters(/*recurse=*/false)) out.insert(p.unsafeGetTensorImpl());
    for (const auto& child : m.children()) visit(*child);
  };
  visit(model);
  return out;
}

Stage3Layout make_stage3_layout(const std::vector<ZeroUnitBase*>& units,
                                const std::vector<at::Tensor>& trainable, int world_size,
                                const ZeroConfig& config,
                                const std::unordered_set<const c10::TensorImpl*>& outside) {
  std::unordered_map<Key, std::vector<int64_t>> shape;
  for (auto& p : trainable) shape[key(p)] = p.sizes().vec();
  for (auto* u : units)
    if (const auto* shard = init_shard(*u))
      for (size_t i = 0; i < shard->params.size(); ++i) shape[key(shard->params[i])] = shard->shapes[i];
  auto owner = owners(units);
  Stage3Layout layout;
  layout.units.resize(units.size() + 1);
  for (size_t u = 0; u < units.size(); ++u) layout.units[u + 1].module = units[u];
  int64_t persistent_total = 0;
  for (auto& p : trainable) {
    const auto& s = shape[key(p)];
    const int64_t n = c10::multiply_integers(s);
    auto it = owner.find(key(p));
    int unit = it == owner.end() || outside.count(p.unsafeGetTensorImpl()) ? 0 : it->second;
    if (unit != 0 && n <= config.stage3_param_persistence_threshold &&
        persistent_total + n <= config.stage3_model_persistence_threshold) {
      persistent_total += n;
      unit = 0;
    }
    auto& slots = layout.units[unit];
    slots.offsets.push_back(slots.params.empty() ? 0 : slots.offsets.back() + c10::multiply_integers(slots.shapes.back()));
    slots.params.push_back(p);
    slots.shapes.push_back(s);
  }
  for (auto& slots : layout.units) {
    int64_t numel = slots.params.empty() ? 0 : slots.offsets.back() + c10::multiply_integers(slots.shapes.back());
    // A unit without trainable parameters has an empty buffer (nothing to gather or reduce).
    slots.layout = numel == 0 ? PartitionLayout{0, 0, 0, world_size}
                              : make_partition_layout(numel, world_size);
    slots.partition_offset = layout.partition_numel;
    layout.partition_numel += slots.layout.partition_numel;
  }
  return layout;
}

}  // namespace zero
}  // namespace deepspeed
