// Stage 3's side of checkpoints: each rank saves and loads its slice of every unit (the fp32
// master and Adam moments there), described as fragments of the parameters, so a stage-3
// checkpoint loads at any world size and stage and any checkpoint loads into stage 3 (the loader
// assembles each fragment from whichever saved pieces overlap it).
#include <torch/torch.h>
#include <c10/util/accumulate.h>

#include "deepspeed/errors.h"
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

// This rank's fragments as views of whole-partition state tensors (moments may be undefined: the
// optimizer has none). A swapped shard's tensors are its state read back from the swap file (the
// rank's 12 bytes per element are in memory while a checkpoint is saved or loaded).
std::vector<StateFragment> Stage3::fragments_over(const std::array<at::Tensor, 3>& state) {
  std::vector<StateFragment> out;
  for_each_piece(layout_, ctx_.rank(), [&](size_t u, size_t i, int64_t lo, int64_t hi, int64_t begin) {
    const auto& unit = layout_.units[u];
    StateFragment f;
    f.param = param_index_.at(unit.params[i].unsafeGetTensorImpl());
    f.offset = lo - unit.offsets[i];
    f.numel = hi - lo;
    const int64_t at = unit.partition_offset + (lo - begin);
    f.master = state[0].narrow(0, at, f.numel);
    if (state[1].defined()) f.exp_avg = state[1].narrow(0, at, f.numel);
    if (state[2].defined()) f.exp_avg_sq = state[2].narrow(0, at, f.numel);
    out.push_back(f);
  });
  return out;
}

std::vector<StateFragment> Stage3::fragments_to_save() {
  return fragments_over(shard_->state_for_save());
}

std::vector<StateFragment> Stage3::fragments_to_load(bool create_moments) {
  return fragments_over(shard_->state_for_load(create_moments));
}

void Stage3::finish_load(int64_t adam_step) {
  shard_->finish_load(adam_step, *params_);
  gatherer_->regather_root();
}

void Stage3::refresh_masters_from_model() { shard_->refresh_masters(*params_); }

}  // namespace zero
}  // namespace deepspeed
