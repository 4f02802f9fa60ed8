// PartitionedStage's side of checkpoints: the fp32 masters and their Adam moments, as fragments
// of the parameters (checkpoint/layout.h). Stages 1/2 save and load their own partition; stage 0
// in 16 bits (one partition spanning the buffer, the same state on every rank) saves the 1/N share
// a partition would hold and loads every parameter whole.
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

// Elements [offset, offset + numel) of a parameter living at flat position `at` of master
// (master's element 0 being flat position `base`).
StateFragment fragment(const at::Tensor& master, torch::optim::AdamWParamState* state, size_t param,
                       int64_t offset, int64_t numel, int64_t at, int64_t base) {
  StateFragment f;
  f.param = param;
  f.offset = offset;
  f.numel = numel;
  f.master = master.narrow(0, at - base, numel);
  attach_moments(state, at - base, numel, f.exp_avg, f.exp_avg_sq);
  return f;
}
}  // namespace

std::vector<StateFragment> PartitionedStage::fragments_to_save() {
  if (swapped_) return swapped_fragments(swapped_->adam->read_state());
  if (master_.scalar_type() != at::kFloat)
    throw CheckpointError("checkpoint: the ZeRO master partition is " +
                          std::string(c10::toString(master_.scalar_type())) + ", expected fp32");
  const auto& slots = flat_->slots();
  const size_t n = slots.size();
  auto* state = adam_state_for(*optimizer_, master_, /*create=*/false);
  std::vector<StateFragment> out;
  if (!partitioned()) {
    std::vector<int64_t> numels(n);
    for (size_t i = 0; i < n; ++i) numels[param_of_slot(i, n)] = slots[i].numel;
    for (auto& r : checkpoint::partition_fragments(numels, comm_->world_size(), comm_->rank()))
      out.push_back(fragment(master_, state, r.param, r.offset, r.numel,
                             slots[param_of_slot(r.param, n)].offset + r.offset, 0));
    return out;
  }
  const auto& layout = flat_->layout();
  const int64_t begin = layout.begin(comm_->rank()), end = layout.end(comm_->rank());
  for (size_t i = 0; i < n; ++i) {
    const int64_t lo = std::max(begin, slots[i].offset);
    const int64_t hi = std::min(end, slots[i].offset + slots[i].numel);
    if (hi > lo)
      out.push_back(fragment(master_, state, param_of_slot(i, n), lo - slots[i].offset, hi - lo, lo, begin));
  }
  return out;
}

// Under offload_optimizer nvme (stages 1/2): views of the state read back from the swap file.
std::vector<StateFragment> PartitionedStage::swapped_fragments(const std::array<at::Tensor, 3>& state) {
  const auto& slots = flat_->slots();
  const size_t n = slots.size();
  const auto& layout = flat_->layout();
  const int64_t begin = layout.begin(comm_->rank()), end = layout.end(comm_->rank());
  std::vector<StateFragment> out;
  for (size_t i = 0; i < n; ++i) {
    const int64_t lo = std::max(begin, slots[i].offset);
    const int64_t hi = std::min(end, slots[i].offset + slots[i].numel);
    if (hi <= lo) continue;
    StateFragment f;
    f.param = param_of_slot(i, n);
    f.offset = lo - slots[i].offset;
    f.numel = hi - lo;
    f.master = state[0].narrow(0, lo - begin, f.numel);
    f.exp_avg = state[1].narrow(0, lo - begin, f.numel);
    f.exp_avg_sq = state[2].narrow(0, lo - begin, f.numel);
    out.push_back(f);
  }
  return out;
}

std::vector<StateFragment> PartitionedStage::fragments_to_load(bool create_moments) {
  if (swapped_) {
    swapped_loading_ = swapped_->adam->read_state();
    return swapped_fragments(swapped_loading_);
  }
  auto* state = adam_state_for(*optimizer_, master_, create_moments);
  if (partitioned()) return fragments_to_save();
  const auto& slots = flat_->slots();
  std::vector<StateFragment> out;
  for (size_t i = 0; i < slots.size(); ++i)
    out.push_back(fragment(master_, state, param_of_slot(i, slots.size()), 0, slots[i].numel,
                           slots[i].offset, 0));
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
