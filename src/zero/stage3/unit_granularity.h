// stage3_module_granularity_threshold: which ZeroUnits stage 3 gathers on their own, and which it
// folds into the unit around them (one all-gather instead of several small ones: DeepSpeed's
// users' "ZeRO-3 is slow, too many small gathers").
//
// A module's *granularity* is DeepSpeed's: the parameters under it (full sizes, also while
// zero::Init holds them partitioned) divided by its layers, where a module without children that
// has parameters is one layer, a module with children is one layer plus theirs, containers
// (ModuleList, Sequential, ModuleDict, ParameterList, ParameterDict, LayerList) add none, and a
// module without parameters counts neither (granularity: none). Walking down from the model, the
// first module on each path whose granularity is at most the threshold is a *leaf*: DeepSpeed
// hooks only it, gathering everything under it at once. libtorch modules have no hooks, so here a
// leaf's effect goes through the units: every ZeroUnit under a leaf (strictly, when the leaf is
// itself a unit) that has a kept unit around it is folded into that unit, the innermost one. A
// unit with no unit around it stays a unit (folding it would put it into the root unit, which is
// never released: that changes memory, not the number of gathers).
// zero_optimization.leaf_module (DeepSpeed's set_z3_leaf_modules, as config) names leaves
// outright, by type or by name; the walk stops at them as at a leaf by granularity.
#pragma once
#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <vector>

#include "deepspeed/config.h"
#include "deepspeed/zero_unit.h"

namespace deepspeed {
namespace zero {

// What makes a module a leaf.
struct LeafRules {
  int64_t threshold = 0;     // stage3_module_granularity_threshold (0: no granularity rule)
  LeafModuleConfig modules;  // zero_optimization.leaf_module
  bool any() const { return threshold > 0 || !modules.empty(); }
};

struct FetchUnits {
  std::vector<ZeroUnitBase*> units;                // kept, in find_units order
  std::vector<std::vector<ZeroUnitBase*>> folded;  // per kept unit: the units folded into it
  std::vector<std::string> leaves;                 // the leaf modules' names ("" for the model)
  // The smallest granularity of any module (INT64_MAX when none has one) and that module's name,
  // for the warning when the threshold is below it (nothing can become a leaf).
  int64_t smallest_granularity = INT64_MAX;
  std::string smallest_module;
  // leaf_module entries that match no module of the model ("classes 'MLP'").
  std::vector<std::string> unmatched;
};

// Without rules: every unit kept (find_units(model)), nothing folded, no granularity computed.
FetchUnits choose_fetch_units(torch::nn::Module& model, const LeafRules& rules);
inline FetchUnits choose_fetch_units(torch::nn::Module& model, int64_t threshold) {
  return choose_fetch_units(model, LeafRules{threshold, {}});
}

// What rank 0 says at initialize() (lines ending in a newline): the units folded and the leaf
// modules, or a warning when the threshold is below every module's granularity (the value it
// needs, as DeepSpeed's warning), and one per leaf_module entry that matches nothing. Empty
// without rules.
std::string describe_fetch_units(const FetchUnits& fetch, const LeafRules& rules);
inline std::string describe_fetch_units(const FetchUnits& fetch, int64_t threshold) {
  return describe_fetch_units(fetch, LeafRules{threshold, {}});
}

}  // namespace zero
}  // namespace deepspeed
