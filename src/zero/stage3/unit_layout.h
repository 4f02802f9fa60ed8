// Which parameters each stage-3 unit gathers, and where they sit in the flat buffers.
//
// Unit 0 is the *root unit*: trainable parameters outside every ZeroUnit, parameters shared by
// two units that do not nest (a tied embedding and head), parameters a unit registers that a
// module outside every unit registers too (a head inside a unit tied to the root's embedding:
// the root reads it outside the unit's forward), and *persistent* parameters (numel <=
// stage3_param_persistence_threshold, while their total stays <= stage3_model_persistence_threshold).
// It is always gathered. Units 1..U are the ZeroUnits in module-tree order; a parameter belongs
// to the innermost unit that contains every module registering it (parameter_units: a weight of
// a unit nested in U that a plain module of U registers too is U's, which reads it outside the
// nested unit's forward). Frozen parameters are not managed (they stay whole).
//
// Each unit's parameters, in registration order, form one flat buffer padded to
// world_size * partition::kAlignment elements; rank r owns the contiguous slice r of it
// (make_partition_layout). The rank's *partition buffer* is its slices of all units laid end to
// end: unit u's slice starts at partition_offset. Gradients use the same layout.
#pragma once
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <torch/nn/module.h>

#include "deepspeed/config.h"
#include "deepspeed/zero_unit.h"
#include "partition/partition.h"

namespace deepspeed {
namespace zero {

struct UnitSlots {
  ZeroUnitBase* module = nullptr;  // nullptr for the root unit
  // ZeroUnits folded into this one by stage3_module_granularity_threshold (unit_granularity.h):
  // not attached, they run as plain modules inside this unit's forward; their parameters are
  // this unit's, and their zero::Init slices are adopted with it.
  std::vector<ZeroUnitBase*> folded;
  std::vector<at::Tensor> params;  // trainable parameters, in registration order
  std::vector<std::vector<int64_t>> shapes;
  std::vector<int64_t> offsets;    // first element of each parameter in the unit's flat buffer
  PartitionLayout layout;          // the unit's flat buffer over the ranks
  int64_t partition_offset = 0;    // where this rank's slice of the unit sits in its partition buffer
};

struct Stage3Layout {
  std::vector<UnitSlots> units;  // [0] is the root
  int64_t partition_numel = 0;   // elements of every rank's partition buffer
};

// The ZeroUnits under (and including) `model`, each once, in module-tree order.
std::vector<ZeroUnitBase*> find_units(torch::nn::Module& model);

// The parameters that a module outside every ZeroUnit registers itself (`model` when it is no
// unit, and every module not under a unit), whether or not a unit registers them too.
std::unordered_set<const c10::TensorImpl*> parameters_outside_units(torch::nn::Module& model);

// The unit (1-based index into `units`, find_units(model)'s) that gathers each parameter of
// `model`: the innermost unit around every module that registers it (a unit around itself), or 0,
// the root, when a module outside every unit registers it or the registering modules' units do
// not nest (two sibling units sharing a weight).
std::unordered_map<const c10::TensorImpl*, int> parameter_units(
    torch::nn::Module& model, const std::vector<ZeroUnitBase*>& units);

// `trainable`: the parameters with requires_grad, in registration order. Shapes come from the
// parameters, or from the zero::Init shard of a unit (or of a unit folded into it) for
// parameters it holds partitioned. `owners` (parameter_units): where each parameter goes;
// without it, the units alone decide (the innermost unit holding it), which cannot see a module
// outside the units registering it too.
Stage3Layout make_stage3_layout(const std::vector<ZeroUnitBase*>& units,
                                const std::vector<at::Tensor>& trainable, int world_size,
                                const ZeroConfig& config,
                                const std::unordered_map<const c10::TensorImpl*, int>* owners = nullptr);

}  // namespace zero
}  // namespace deepspeed
