#include "zero/stage3/unit_granularity.h"

#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/parameterdict.h>
#include <torch/nn/modules/container/parameterlist.h>
#include <torch/nn/modules/container/sequential.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "zero/stage3/full_parameter_sizes.h"
#include "zero/stage3/unit_layout.h"

namespace deepspeed {
namespace zero {
namespace {
constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
// DeepSpeed's Z3_MAX_LEAF_SIZE: a module above this many parameters is never a leaf, however
// many layers it has (a leaf is gathered whole).
constexpr int64_t kMaxLeafNumel = 1000000000;

// Modules that only hold others: DeepSpeed never makes them leaves (their forward may never run).
bool is_container(const torch::nn::Module& m) {
  return dynamic_cast<const torch::nn::ModuleListImpl*>(&m) ||
         dynamic_cast<const torch::nn::SequentialImpl*>(&m) ||
         dynamic_cast<const torch::nn::ModuleDictImpl*>(&m) ||
         dynamic_cast<const torch::nn::ParameterListImpl*>(&m) ||
         dynamic_cast<const torch::nn::ParameterDictImpl*>(&m) ||
         dynamic_cast<const LayerListImpl*>(&m);
}

// The type name without namespaces (at template depth 0): "deepspeed::ZeroUnit<gpt::Block>" ->
// "ZeroUnit<gpt::Block>".
std::string short_type(const std::string& full) {
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i + 1 < full.size(); ++i) {
    if (full[i] == '<') ++depth;
    if (full[i] == '>') --depth;
    if (depth == 0 && full[i] == ':' && full[i + 1] == ':') start = i + 2;
  }
  return full.substr(start);
}

bool type_is(const torch::nn::Module& m, const std::string& wanted) {
  const std::string full = m.name(), brief = short_type(full);
  const bool impl = brief.size() > 4 && brief.compare(brief.size() - 4, 4, "Impl") == 0;
  return wanted == full || wanted == brief || (impl && wanted == brief.substr(0, brief.size() - 4));
}

bool ends_with(const std::string& s, const std::string& end) {
  return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
}

// One zero_optimization.leaf_module entry: its list ("classes", "names", "name_suffixes") and text.
struct LeafEntry {
  std::string kind, text;
  // Whether the module `m`, named `name` in the model, is the one this entry names.
  bool matches(const torch::nn::Module& m, const std::string& name) const {
    if (kind == "names") return name == text;
    if (kind == "name_suffixes") return !name.empty() && ends_with(name, text);
    const auto* unit = dynamic_cast<const ZeroUnitBase*>(&m);
    const auto* inner = unit ? unit->inner_module().get() : nullptr;
    return type_is(m, text) || (inner && type_is(*inner, text));
  }
};

// Every entry of the config, and the ones no module of `model` matches (as "classes 'MLP'").
class LeafNames {
 public:
  explicit LeafNames(const LeafModuleConfig& c) {
    for (const auto& t : c.classes) entries_.push_back({"classes", t});
    for (const auto& n : c.names) entries_.push_back({"names", n});
    for (const auto& s : c.name_suffixes) entries_.push_back({"name_suffixes", s});
  }

  bool match(const torch::nn::Module& m, const std::string& name) const {
    for (const auto& e : entries_)
      if (e.matches(m, name)) return true;
    return false;
  }

  std::vector<std::string> unmatched(torch::nn::Module& model) const {
    std::vector<bool> hit(entries_.size(), false);
    std::function<void(torch::nn::Module&, const std::string&)> visit =
        [&](torch::nn::Module& m, const std::string& name) {
          for (size_t i = 0; i < entries_.size(); ++i)
            hit[i] = hit[i] || entries_[i].matches(m, name);
          for (const auto& c : m.named_children())
            visit(*c.value(), name.empty() ? c.key() : name + "." + c.key());
        };
    visit(model, "");
    std::vector<std::string> out;
    for (size_t i = 0; i < entries_.size(); ++i)
      if (!hit[i]) out.push_back(entries_[i].kind + " '" + entries_[i].text + "'");
    return out;
  }

 private:
  std::vector<LeafEntry> entries_;
};

class Granularity {
 public:
  explicit Granularity(torch::nn::Module& model) : full_(partitioned_parameter_numels(model)) {}

  // (layers, parameters) under m; records m's granularity and the smallest one met.
  std::pair<int64_t, int64_t> measure(torch::nn::Module& m, const std::string& name) {
    const int64_t own = numel(m.parameters(/*recurse=*/false));
    if (own == 0 && numel(m.parameters()) == 0) return {0, 0};  // GELU, Dropout: nothing to gather
    const auto children = m.named_children();
    if (children.is_empty()) return {1, own};
    int64_t layers = 0, params = own;
    for (const auto& c : children) {
      auto [l, p] = measure(*c.value(), name.empty() ? c.key() : name + "." + c.key());
      layers += l;
      params += p;
    }
    if (is_container(m)) return {layers, params};
    layers += 1;
    const int64_t g = params <= kMaxLeafNumel ? params / layers : kNone;
    value_[&m] = g;
    if (g < smallest) {
      smallest = g;
      smallest_name = name;
    }
    return {layers, params};
  }

  int64_t of(const torch::nn::Module& m) const {
    auto it = value_.find(&m);
    return it == value_.end() ? kNone : it->second;
  }
  int64_t total(const torch::nn::Module& m) const { return numel(m.parameters()); }

  int64_t smallest = kNone;
  std::string smallest_name;

 private:
  int64_t numel(const std::vector<at::Tensor>& params) const {
    int64_t n = 0;
    for (const auto& p : params) {
      auto it = full_.find(p.unsafeGetTensorImpl());
      n += it == full_.end() ? p.numel() : it->second;
    }
    return n;
  }
  std::unordered_map<const c10::TensorImpl*, int64_t> full_;
  std::unordered_map<const torch::nn::Module*, int64_t> value_;
};
}  // namespace

FetchUnits choose_fetch_units(torch::nn::Module& model, const LeafRules& rules) {
  FetchUnits out;
  const std::vector<ZeroUnitBase*> all = find_units(model);
  if (!rules.any()) {
    out.units = all;
    out.folded.resize(all.size());
    return out;
  }
  Granularity g(model);
  g.measure(model, "");
  out.smallest_granularity = g.smallest;
  out.smallest_module = g.smallest_name;
  const LeafNames named(rules.modules);
  out.unmatched = named.unmatched(model);

  // DeepSpeed's preorder: the first module on a path named a leaf, or at or below the threshold,
  // is the leaf.
  std::unordered_set<const torch::nn::Module*> leaves;
  std::function<void(torch::nn::Module&, const std::string&)> pick = [&](torch::nn::Module& m,
                                                                         const std::string& name) {
    if (g.total(m) == 0) return;
    if (named.match(m, name) || (rules.threshold > 0 && g.of(m) <= rules.threshold)) {
      if (leaves.insert(&m).second) out.leaves.push_back(name);
      return;
    }
    for (const auto& c : m.named_children())
      pick(*c.value(), name.empty() ? c.key() : name + "." + c.key());
  };
  pick(model, "");

  // Each unit's fate on every path that reaches it: folded into the innermost kept unit around
  // it when a leaf lies above it below that unit (or is that unit), else kept. A unit reached
  // along two paths with different fates (a module registered twice) is kept: it is gathered
  // when it runs either way, so keeping it is always correct.
  std::unordered_map<const ZeroUnitBase*, const ZeroUnitBase*> into;  // nullptr: kept
  std::set<std::pair<const torch::nn::Module*, const ZeroUnitBase*>> seen;
  std::function<void(torch::nn::Module&, const ZeroUnitBase*, bool)> walk =
      [&](torch::nn::Module& m, const ZeroUnitBase* around, bool in_leaf) {
        if (!seen.insert({&m, around}).second) return;
        if (auto* u = dynamic_cast<const ZeroUnitBase*>(&m)) {
          const ZeroUnitBase* fate = in_leaf && around ? around : nullptr;
          auto [it, first] = into.emplace(u, fate);
          if (!first && it->second != fate) it->second = nullptr;
          if (!fate) around = u;
        }
        in_leaf = in_leaf || leaves.count(&m) > 0;
        for (const auto& c : m.children()) walk(*c, around, in_leaf);
      };
  walk(model, nullptr, false);

  // Every unit a unit is folded into is kept: the walk folds into kept units only, and a unit
  // kept on one path stays kept.
  std::unordered_map<const ZeroUnitBase*, size_t> index;
  for (auto* u : all)
    if (into[u] == nullptr) {
      index.emplace(u, out.units.size());
      out.units.push_back(u);
    }
  out.folded.resize(out.units.size());
  for (auto* u : all)
    if (const ZeroUnitBase* target = into[u]) out.folded[index.at(target)].push_back(u);
  return out;
}

std::string describe_fetch_units(const FetchUnits& fetch, const LeafRules& rules) {
  if (!rules.any()) return "";
  std::string said;
  for (const auto& entry : fetch.unmatched)
    said += "[deepspeed] warning: zero_optimization.leaf_module " + entry +
            " matches no module of the model\n";
  const std::string threshold_key =
      "stage3_module_granularity_threshold " + std::to_string(rules.threshold);
  if (fetch.leaves.empty()) {
    if (rules.threshold <= 0)
      return said +
             "[deepspeed] zero_optimization.leaf_module: no module with parameters is a "
             "leaf; every ZeroUnit is gathered on its own\n";
    if (fetch.smallest_granularity == kNone)
      return said + "[deepspeed] warning: " + threshold_key + ": no module has a granularity (no " +
             "module with both parameters and submodules); every ZeroUnit is gathered on its own\n";
    return said + "[deepspeed] warning: " + threshold_key +
           " is below the smallest module granularity, " +
           std::to_string(fetch.smallest_granularity) + " (" +
           (fetch.smallest_module.empty() ? "the model" : "'" + fetch.smallest_module + "'") +
           "): no ZeroUnit is folded. Set it to at least " +
           std::to_string(fetch.smallest_granularity) + " to gather that module whole\n";
  }
  std::string key = rules.threshold > 0 ? threshold_key : "";
  if (!rules.modules.empty()) key += (key.empty() ? "" : " and ") + std::string("leaf_module");
  size_t folded = 0;
  for (const auto& f : fetch.folded) folded += f.size();
  std::string leaves;
  const size_t shown = std::min<size_t>(fetch.leaves.size(), 4);
  for (size_t i = 0; i < shown; ++i)
    leaves +=
        (i ? ", " : "") + (fetch.leaves[i].empty() ? "the model" : "'" + fetch.leaves[i] + "'");
  if (fetch.leaves.size() > shown)
    leaves += " and " + std::to_string(fetch.leaves.size() - shown) + " more";
  return said + "[deepspeed] " + key + ": " + std::to_string(fetch.leaves.size()) + " leaf module" +
         (fetch.leaves.size() == 1 ? "" : "s") + " (" + leaves + "); " + std::to_string(folded) +
         " ZeroUnit" + (folded == 1 ? "" : "s") + " folded into the unit around them, " +
         std::to_string(fetch.units.size()) + " gathered on their own\n";
}

}  // namespace zero
}  // namespace deepspeed
