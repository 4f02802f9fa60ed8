// PartitionedStage's side of checkpoints: its partition of the fp32 masters and their Adam moments,
// as fragments of the parameters (checkpoint/layout.h).
#include <torch/torch.h>

#include "deepspeed/errors.h"
#include "zero/adam_state_checkpoint.h"
#include "zero/partitioned_stage.h"

namespace deepspeed {
namespace zero {

// Slot i of the flat buffer holds parameter (n - 1 - i): FlatParams lays them in reverse order.
std::vector<StateFragment> PartitionedStage::fragments_to_save() {
  if (master_.scalar_type() != at::kFloat)
    throw CheckpointError("checkpoint: the ZeRO master partition is " +
                          std::string(c10::toString(master_.scalar_type())) + ", expected fp32");
  const auto& layout = flat_->layout();
  const auto& slots = flat_->slots();
  const int rank = comm_->rank();
  const int64_t begin = layout.begin(rank), end = layout.end(rank);
  auto* state = adam_state_for(*optimizer_, master_, /*create=*/false);
  std::vector<StateFragment> out;
  for (size_t i = 0; i < slots.size(); ++i) {
    const int64_t lo = std::max(begin, slots[i].offset);
    const int64_t hi = std::min(end, slots[i].offset + slots[i].numel);
    if (hi <= lo) continue;
    StateFragment f;
    f.param = slots.size() - 1 - i;
    f.offset = lo - slots[i].offset;
    f.numel = hi - lo;
    f.master = master_.narrow(0, lo - begin, f.numel);
    attach_moments(state, lo - begin, f.numel, f.exp_avg, f.exp_avg_sq);
    out.push_back(std::move(f));
  }
  return out;
}

std::vector<StateFragment> PartitionedStage::fragments_to_load(bool create_moments) {
  adam_state_for(*optimizer_, master_, create_moments);
  return fragments_to_save();
}

int64_t PartitionedStage::adam_step() const {
  if (!is_fused_adam(optimizer_.get())) return -1;
  auto* state = adam_state_for(*optimizer_, master_, /*create=*/false);
  return state ? state->step() : 0;
}

void PartitionedStage::finish_load(int64_t adam_step) {
  if (adam_step >= 0)
    if (auto* state = adam_state_for(*optimizer_, master_, /*create=*/true)) state->step(adam_step);
  all_gather_partitions();
}

void PartitionedStage::refresh_masters_from_model() {
  torch::NoGradGuard no_grad;
  master_.copy_(flat_->partition(comm_->rank()));
}

}  // namespace zero
}  // namespace deepspeed
