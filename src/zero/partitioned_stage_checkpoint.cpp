// PartitionedStage's side of checkpoints: the fp32 masters and their Adam moments, as fragments
// of the parameters (checkpoint/layout.h). Stages 1/2 save and load their own partition; stage 0
// in 16 bits (one partition spanning the buffer, the same state on every rank) saves the 1/N share
// a partition would hold and loads every parameter whole.
#include <array>

#include <torch/torch.h>

#include "checkpoint/layout.h"
#include "deepspeed/errors.h"
#include "zero/adam_state_checkpoint.h"
#include "zero/partitioned_stage.h"
#include "zero/swapped_optimizer.h"

namespace deepspeed {
namespace zero {
namespace {
// Slot i of the flat buffer holds parameter (n - 1 - i): FlatParams lays them in reverse order.
size_t param_of_slot(size_t slot, size_t n) { return n - 1 - slot; }

// Elements [offset, offset + numel) of a parameter living at flat position `at` of the state
// tensors [master, exp_avg, exp_avg_sq] (moments may be undefined), whose element 0 is flat
// position `base`.
StateFragment fragment(const std::array<at::Tensor, 3>& t, size_t param, int64_t offset,
                       int64_t numel, int64_t at, int64_t base) {
  StateFragment f;
  f.param = param;
  f.offset = offset;
  f.numel = numel;
  f.master = t[0].narrow(0, at - base, numel);
  if (t[1].defined()) f.exp_avg = t[1].narrow(0, at - base, numel);
  if (t[2].defined()) f.exp_avg_sq = t[2].narrow(0, at - base, numel);
  return f;
}
}  // namespace

// The fp32 master and the optimizer's moments for it (undefined when it has none), flat.
std::array<at::Tensor, 3> PartitionedStage::state_tensors(bool create_moments) {
  if (swapped_) return swapped_->adam->read_state();  // from the swap file, for the checkpoint
  if (master_.scalar_type() != at::kFloat)
    throw CheckpointError("checkpoint: the ZeRO master partition is " +
                          std::string(c10::toString(master_.scalar_type())) + ", expected fp32");
  std::array<at::Tensor, 3> t{master_, at::Tensor(), at::Tensor()};
  attach_moments(adam_state_for(*optimizer_, master_, create_moments), 0, master_.numel(), t[1], t[2]);
  return t;
}

std::vector<StateFragment> PartitionedStage::fragments_to_save() {
  return fragments_over(state_tensors(/*create_moments=*/false));
}

// Stages 1/2: this rank's partition; stage 0 (16-bit): the 1/N share a partition would hold.
std::vector<StateFragment> PartitionedStage::fragments_over(const std::array<at::Tensor, 3>& state) {
  const auto& slots = flat_->slots();
  const size_t n = slots.size();
  std::vector<StateFragment> out;
  if (!partitioned()) {
    std::vector<int64_t> numels(n);
    for (size_t i = 0; i < n; ++i) numels[param_of_slot(i, n)] = slots[i].numel;
    for (auto& r : checkpoint::partition_fragments(numels, comm_->world_size(), comm_->rank()))
      out.push_back(fragment(state, r.param, r.offset, r.numel,
                             slots[param_of_slot(r.param, n)].offset + r.offset, 0));
    return out;
  }
  const auto& layout = flat_->layout();
  const int64_t begin = layout.begin(comm_->rank()), end = layout.end(comm_->rank());
  for (size_t i = 0; i < n; ++i) {
    const int64_t lo = std::max(begin, slots[i].offset);
    const int64_t hi = std::min(end, slots[i].offset + slots[i].numel);
    if (hi > lo)
      out.push_back(fragment(state, param_of_slot(i, n), lo - slots[i].offset, hi - lo, lo, begin));
  }
  return out;
}

std::vector<StateFragment> PartitionedStage::fragments_to_load(bool create_moments) {
  const auto state = state_tensors(create_moments);
  if (swapped_) swapped_loading_ = state;  // finish_load writes it back to the swap file
  if (partitioned()) return fragments_over(state);
  const auto& slots = flat_->slots();
  std::vector<StateFragment> out;
  for (size_t i = 0; i < slots.size(); ++i)
    out.push_back(fragment(state, param_of_slot(i, slots.size()), 0, slots[i].numel, slots[i].offset, 0));
  return out;
}

int64_t PartitionedStage::adam_step() const {
  if (swapped_) return swapped_->steps;
  return fused_adam_step(*optimizer_, master_);
}

void PartitionedStage::finish_load(int64_t adam_step) {
  if (swapped_) {
    torch::NoGradGuard no_grad;
    auto& [master, exp_avg, exp_avg_sq] = swapped_loading_;
    TORCH_CHECK(master.defined(), "PartitionedStage::finish_load without fragments_to_load");
    swapped_->adam->write_state(master, exp_avg, exp_avg_sq);
    swapped_->steps = adam_step;
    own_partition().copy_(master);
    swapped_loading_ = {};
    all_gather_partitions(/*copy_master=*/false);
    return;
  }
  set_fused_adam_step(*optimizer_, master_, adam_step);
  all_gather_partitions();  // masters -> this rank's (16-bit) partition -> every rank
}

void PartitionedStage::refresh_masters_from_model() {
  torch::NoGradGuard no_grad;
  if (swapped_) {
    at::Tensor own = own_partition();
    swapped_->adam->reset_masters([own](int64_t begin, int64_t n) { return own.narrow(0, begin, n); });
    return;
  }
  master_.copy_(own_partition());
}

}  // namespace zero
}  // namespace deepspeed
