// Stage 3's side of checkpoints: each rank saves and loads its slice of every unit (the fp32
// master and Adam moments there), described as fragments of the parameters, so a stage-3
// checkpoint loads at any world size and stage and any checkpoint loads into stage 3 (the loader
// assembles each fragment from whichever saved pieces overlap it).
#include <torch/torch.h>
#include <c10/util/accumulate.h>

#include "deepspeed/errors.h"
#include "zero/fragment_state.h"
#include "zero/stage3/stage3.h"

namespace deepspeed {
namespace zero {
namespace {

// Rank `rank`'s fragments in partition order; `visit(unit, param_slot, lo, hi, begin)` gets the
// overlap [lo, hi) of the parameter with the rank's slice [begin, ...) of the unit's flat buffer.
template <class Visit>
void for_each_piece(const Stage3Layout& layout, int rank, Visit&& visit) {
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const auto& unit = layout.units[u];
    if (unit.params.empty()) continue;
    const int64_t begin = unit.layout.begin(rank);
    const int64_t end = begin + unit.layout.partition_numel;
    for (size_t i = 0; i < unit.params.size(); ++i) {
      const int64_t o = unit.offsets[i], n = c10::multiply_integers(unit.shapes[i]);
      const int64_t lo = std::max(begin, o), hi = std::min(end, o + n);
      if (hi > lo) visit(u, i, lo, hi, begin);
    }
  }
}

}  // namespace

std::vector<StateFragment> Stage3::fragments_of_rank(int rank, const std::vector<int64_t>& numels,
                                                     int world_size) const {
  std::vector<StateFragment> out;
  for_each_piece(layout_, rank, [&](size_t u, size_t i, int64_t lo, int64_t hi, int64_t) {
    const auto& unit = layout_.units[u];
    StateFragment f;
    f.param = param_index_.at(unit.params[i].unsafeGetTensorImpl());
    f.offset = lo - unit.offsets[i];
    f.numel = hi - lo;
    out.push_back(f);
  });
  return out;
}

// This rank's fragments; `at` places each in the partition buffer, where the shard optimizer
// keeps its state in the same layout (a swapped shard is then read one sub-group at a time).
std::vector<StateFragment> Stage3::own_fragments() const {
  std::vector<StateFragment> out;
  for_each_piece(layout_, ctx_.rank(), [&](size_t u, size_t i, int64_t lo, int64_t hi, int64_t begin) {
    const auto& unit = layout_.units[u];
    StateFragment f;
    f.param = param_index_.at(unit.params[i].unsafeGetTensorImpl());
    f.offset = lo - unit.offsets[i];
    f.numel = hi - lo;
    f.at = unit.partition_offset + (lo - begin);
    out.push_back(f);
  });
  return out;
}

std::unique_ptr<FragmentState> Stage3::state_to_save() {
  return windowed_fragment_state(own_fragments(), shard_->windows_for_save());
}

std::unique_ptr<FragmentState> Stage3::state_to_load(bool create_moments) {
  return windowed_fragment_state(own_fragments(), shard_->windows_for_load(create_moments));
}

const std::pair<int, size_t>* Stage3::slot_of(const at::Tensor& param) const {
  if (slot_of_.empty())
    for (size_t u = 0; u < layout_.units.size(); ++u)
      for (size_t i = 0; i < layout_.units[u].params.size(); ++i)
        slot_of_[layout_.units[u].params[i].unsafeGetTensorImpl()] = {static_cast<int>(u), i};
  auto it = slot_of_.find(param.unsafeGetTensorImpl());
  return it == slot_of_.end() ? nullptr : &it->second;
}

int Stage3::gather_group_of(const at::Tensor& param) const {
  const auto* slot = slot_of(param);
  return slot ? slot->first : -1;
}

std::vector<int64_t> Stage3::whole_shape(const at::Tensor& param) const {
  const auto* slot = slot_of(param);
  return slot ? layout_.units[slot->first].shapes[slot->second] : param.sizes().vec();
}

std::function<void()> Stage3::gather_group(int unit, std::optional<int> modifier_rank) {
  TORCH_CHECK(unit >= 0 && unit < static_cast<int>(layout_.units.size()), "stage 3: no unit ",
              unit);
  if (layout_.units[unit].params.empty()) return [] {};
  gatherer_->pin(unit);
  std::vector<at::Tensor> before;  // as gather_for_access: the slice before the caller's edits
  if (modifier_rank) {
    torch::NoGradGuard no_grad;
    before.push_back(own_slice(unit).clone());
  }
  return [this, unit, modifier_rank, before = std::move(before)] {
    release_units({unit}, modifier_rank, before);
  };
}

void Stage3::finish_load(int64_t adam_step) {
  gatherer_->before_store_changes();
  shard_->finish_load(adam_step, *params_);
  gatherer_->regather_root();
}

void Stage3::refresh_masters_from_model() { shard_->refresh_masters(*params_); }

}  // namespace zero
}  // namespace deepspeed
