#include "zero/stage3/unit_layout.h"

#include <algorithm>
#include <functional>
#include <set>
#include <utility>

#include <c10/util/accumulate.h>
#include <unordered_map>
#include <unordered_set>

#include "zero/stage3/init_shard.h"

namespace deepspeed {
namespace zero {
namespace {
using Key = const void*;
Key key(const at::Tensor& t) { return t.unsafeGetTensorImpl(); }

// Without the model (make_stage3_layout's callers that have only the units): for each parameter,
// the index (1-based) of the innermost unit holding it, or 0 (root) when it lies outside every
// unit or in two units neither of which contains the other.
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

std::unordered_map<const c10::TensorImpl*, int> parameter_units(
    torch::nn::Module& model, const std::vector<ZeroUnitBase*>& units) {
  std::unordered_map<const ZeroUnitBase*, int> index;  // 1-based
  for (size_t u = 0; u < units.size(); ++u) index.emplace(units[u], static_cast<int>(u) + 1);
  // The unit around each unit (0: none, the root); a unit met under two different ones counts
  // as under the root, so no chain passes through it.
  std::vector<int> parent(units.size() + 1, -1);
  parent[0] = 0;
  std::unordered_map<Key, std::vector<int>> scopes;  // where each parameter is registered
  std::set<std::pair<const torch::nn::Module*, int>> seen;  // a shared module walked once a scope
  std::function<void(torch::nn::Module&, int)> visit = [&](torch::nn::Module& m, int scope) {
    if (!seen.insert({&m, scope}).second) return;
    if (auto* u = dynamic_cast<ZeroUnitBase*>(&m)) {
      auto it = index.find(u);
      if (it != index.end()) {
        int& up = parent[it->second];
        up = up == -1 || up == scope ? scope : 0;
        scope = it->second;
      }
    }
    for (const auto& p : m.parameters(/*recurse=*/false)) scopes[key(p)].push_back(scope);
    for (const auto& child : m.children()) visit(*child, scope);
  };
  visit(model, 0);
  // Whether unit `outer` (0: the root) is `inner` or lies around it.
  auto around = [&](int outer, int inner) {
    for (int s = inner, hops = 0; hops <= static_cast<int>(units.size()); ++hops) {
      if (s == outer) return true;
      if (s <= 0) return false;
      s = parent[s] < 0 ? 0 : parent[s];
    }
    return false;
  };
  std::unordered_map<const c10::TensorImpl*, int> owner;
  for (const auto& [k, where] : scopes) {
    int outermost = where.front();
    bool chain = true;
    for (int s : where) {
      if (around(s, outermost))
        outermost = s;
      else if (!around(outermost, s))
        chain = false;
    }
    owner[static_cast<const c10::TensorImpl*>(k)] = chain ? outermost : 0;
  }
  return owner;
}

Stage3Layout make_stage3_layout(const std::vector<ZeroUnitBase*>& units,
                                const std::vector<at::Tensor>& trainable, int world_size,
                                const ZeroConfig& config,
                                const std::unordered_map<const c10::TensorImpl*, int>* owners_in) {
  std::unordered_map<Key, std::vector<int64_t>> shape;
  for (auto& p : trainable) shape[key(p)] = p.sizes().vec();
  // The units' own shards and those of units folded into them (unit_granularity.h: plain modules
  // now, their slices still waiting).
  auto shapes_from = [&](const torch::nn::Module& m) {
    const auto* unit = dynamic_cast<const ZeroUnitBase*>(&m);
    if (const auto* shard = unit ? init_shard(*unit) : nullptr)
      for (size_t i = 0; i < shard->params.size(); ++i)
        shape[key(shard->params[i])] = shard->shapes[i];
  };
  for (auto* u : units) {
    shapes_from(*u);
    for (const auto& m : u->modules(/*include_self=*/false)) shapes_from(*m);
  }
  std::unordered_map<Key, int> owner;
  if (owners_in)
    for (const auto& [k, u] : *owners_in) owner.emplace(k, u);
  else
    owner = owners(units);
  Stage3Layout layout;
  layout.units.resize(units.size() + 1);
  for (size_t u = 0; u < units.size(); ++u) layout.units[u + 1].module = units[u];
  int64_t persistent_total = 0;
  for (auto& p : trainable) {
    const auto& s = shape[key(p)];
    const int64_t n = c10::multiply_integers(s);
    auto it = owner.find(key(p));
    int unit = it == owner.end() ? 0 : it->second;
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
