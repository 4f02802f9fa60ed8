// What the library keeps on a ZeroUnit beside the public ZeroUnitBase: the stage-3 engine's hooks
// and zero::Init's slice. Private on purpose: programs compile against include/deepspeed/, and an
// engine detail there would break them whenever it changes; ZeroUnitBase only forward-declares
// these types and befriends detail::ZeroUnitAccess.
#pragma once
#include <memory>
#include <vector>

#include "deepspeed/zero_unit.h"
#include "zero/stage3/unit_layout.h"

namespace deepspeed {
namespace zero {

// What a stage-3 engine does around a unit. Called on the thread running forward / backward.
class UnitHooks {
 public:
  virtual void pre_forward(int unit) = 0;   // gather (and prefetch what follows in the trace)
  virtual void post_forward(int unit) = 0;  // release (unless kept by the reuse distance)
  virtual void pre_backward(int unit) = 0;  // gather again for the unit's backward
  // The unit's parameters and their full shapes (count_parameters reads them while released).
  virtual const UnitSlots& unit_slots(int unit) const = 0;
  // Whether pre_backward does anything: false, and the unit's outputs are returned as they are
  // (no identity node; in-place ops on them stay allowed, as without hooks).
  virtual bool needs_pre_backward() const { return true; }

 protected:
  ~UnitHooks() = default;
};

// Parameters partitioned at construction by zero::Init, waiting for initialize() to adopt them.
struct InitShard {
  at::Tensor slice;                          // this rank's slice of the unit's padded flat buffer
  std::vector<at::Tensor> params;            // the partitioned parameters (now numel 0), in order
  std::vector<std::vector<int64_t>> shapes;  // their shapes
  int64_t padded_numel = 0;
  int world_size = 0;
};

}  // namespace zero

namespace detail {
struct ZeroUnitAccess {
  static void attach(ZeroUnitBase& unit, zero::UnitHooks* hooks, int id) {
    unit.hooks_ = hooks;
    unit.id_ = id;
  }
  static zero::UnitHooks* hooks(const ZeroUnitBase& unit) { return unit.hooks_; }
  static int id(const ZeroUnitBase& unit) { return unit.id_; }
  static std::shared_ptr<zero::InitShard>& shard(ZeroUnitBase& unit) { return unit.shard_; }
  static zero::InitShard* shard(const ZeroUnitBase& unit) { return unit.shard_.get(); }
  static bool& partitioned_by_ended_engine(ZeroUnitBase& unit) {
    return unit.partitioned_by_ended_engine_;
  }
};
}  // namespace detail

namespace zero {
// The engine attaches itself at initialize() (stage 3 only) and detaches (nullptr, -1) when
// destroyed.
inline void attach_unit(ZeroUnitBase& unit, UnitHooks* hooks, int id) {
  detail::ZeroUnitAccess::attach(unit, hooks, id);
}
// zero::Init's slice while the unit's parameters exist only as this rank's slice; else nullptr.
inline InitShard* init_shard(const ZeroUnitBase& unit) {
  return detail::ZeroUnitAccess::shard(unit);
}
}  // namespace zero
}  // namespace deepspeed
