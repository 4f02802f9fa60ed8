#include "zero/forward_waits.h"

#include <algorithm>
#include <limits>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "deepspeed/errors.h"
#include "zero/stage3/unit_layout.h"

namespace deepspeed {
namespace zero {
namespace {

// Sorted, with touching ranges joined: one settle() per run of a unit's parameters.
std::vector<ElementRange> merged(std::vector<ElementRange> ranges) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<ElementRange> out;
  for (const auto& r : ranges) {
    if (r.second <= 0) continue;
    if (!out.empty() && out.back().first + out.back().second >= r.first)
      out.back().second = std::max(out.back().first + out.back().second, r.first + r.second) -
                          out.back().first;
    else
      out.push_back(r);
  }
  return out;
}

}  // namespace

ForwardWaits::ForwardWaits(torch::nn::Module& model, const FlatParams& flat, int64_t window_begin,
                           int64_t window_numel, PendingUpdate& update, const char* config_key)
    : update_(update) {
  // Each trainable parameter's elements in the window (clipped to it).
  std::unordered_map<const c10::TensorImpl*, ElementRange> place;
  for (const auto& slot : flat.slots()) {
    const int64_t lo = std::max(slot.offset, window_begin);
    const int64_t hi = std::min(slot.offset + slot.numel, window_begin + window_numel);
    place[slot.param.unsafeGetTensorImpl()] = {lo - window_begin, std::max<int64_t>(0, hi - lo)};
  }
  std::unordered_set<const c10::TensorImpl*> in_a_unit;
  const std::vector<ZeroUnitBase*> found = find_units(model);
  for (ZeroUnitBase* unit : found) {
    if (detail::ZeroUnitAccess::hooks(*unit))
      throw Error(std::string(config_key) +
                  ": a ZeroUnit of this model is already attached to another engine; destroy "
                  "that engine first (a unit waits for one engine's update)");
    UnitSlots slots;
    slots.module = unit;
    std::vector<ElementRange> ranges;
    for (const auto& p : unit->parameters()) {
      slots.params.push_back(p);
      slots.shapes.push_back(p.sizes().vec());
      auto it = place.find(p.unsafeGetTensorImpl());
      if (it == place.end()) continue;  // frozen: not in the flat buffer
      ranges.push_back(it->second);
      in_a_unit.insert(p.unsafeGetTensorImpl());
    }
    units_.push_back(std::move(slots));
    ranges_.push_back(merged(std::move(ranges)));
  }
  // The root waits for the parameters outside every unit, and for those a unit shares with a
  // module outside every unit (a tied embedding and head): the root may read them first.
  const auto outside = parameters_outside_units(model);
  std::vector<ElementRange> root;
  for (const auto& [impl, range] : place)
    if (!in_a_unit.count(impl) || outside.count(impl)) root.push_back(range);
  root_ = merged(std::move(root));
  units_found_ = !units_.empty();
  for (size_t u = 0; u < found.size(); ++u) attach_unit(*found[u], this, static_cast<int>(u));
}

ForwardWaits::~ForwardWaits() {
  for (auto& slots : units_) attach_unit(*slots.module, nullptr, -1);
}

int64_t ForwardWaits::first_read(int64_t begin, int64_t end) const {
  auto touches = [&](const std::vector<ElementRange>& ranges) {
    for (const auto& [b, n] : ranges)
      if (b < end && begin < b + n) return true;
    return false;
  };
  if (touches(root_)) return 0;
  for (size_t u = 0; u < ranges_.size(); ++u)
    if (touches(ranges_[u])) return static_cast<int64_t>(u) + 1;
  return std::numeric_limits<int64_t>::max();
}

void ForwardWaits::before_forward() {
  if (!units_found_) return update_.complete_step();
  for (const auto& [begin, numel] : root_) update_.settle(begin, begin + numel);
}

void ForwardWaits::pre_forward(int unit) {
  for (const auto& [begin, numel] : ranges_.at(unit)) update_.settle(begin, begin + numel);
}

}  // namespace zero
}  // namespace deepspeed
