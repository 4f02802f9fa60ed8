#include "zero/flat_stage.h"

#include <torch/torch.h>

#include "optim/lamb.h"
#include "partition/partition.h"
#include "zero/fragment_state.h"
#include "zero/tensor_facts.h"

namespace deepspeed {
namespace zero {

FlatStage::FlatStage(std::vector<at::Tensor> params, const StageContext& context,
                     const FlatStageOptions& options, const OptimizerFactory& make_optimizer)
    : ctx_(context) {
  ownership_ = options.partitioned
                   ? make_sharded_ownership(ctx_, options.allgather_bucket_numel)
                   : make_replicated_ownership(ctx_);
  flat_ = std::make_unique<FlatParams>(params, ownership_->parts(), partition::kAlignment, ctx_.device);
  partition_ = std::make_unique<TensorPartition>(flat_->partition(ownership_->owner()).detach());
  const auto comm_dtype = dtype_from_config(options.reduction.comm_dtype, options.param_dtype);
  if (options.scatter_gradients) {
    // Autograd accumulates in the parameter dtype; the scattered partition may be wider.
    const auto grad_dtype = dtype_from_config(options.grad_accum_dtype, options.param_dtype);
    grads_ = std::make_unique<ReduceScatterBuckets>(ctx_, *flat_, options.reduction, comm_dtype,
                                                    grad_dtype);
  } else {
    grads_ = std::make_unique<AllReduceBuckets>(ctx_, *flat_, ownership_->owner(),
                                                options.reduction, comm_dtype);
  }
  shard_ = make_shard_optimizer(options.shard, *partition_, make_optimizer);
  if (auto* lamb = dynamic_cast<optim::Lamb*>(shard_->optimizer().get())) tell_lamb_fragments(*lamb);
}

// Lamb's trust ratio is per parameter, but this rank's partition holds fragments of parameters:
// Lamb sums its fragments' squared norms and sum_over_owners adds the other ranks' (one
// all-reduce of 2 × parameters doubles per step; replicated stage 0 holds every parameter whole
// and adds nothing). optim/lamb.h has the arithmetic.
void FlatStage::tell_lamb_fragments(optim::Lamb& lamb) {
  const auto& layout = flat_->layout();
  const int64_t begin = layout.begin(ownership_->owner()), end = begin + layout.partition_numel;
  std::vector<optim::Lamb::Fragment> fragments;
  const auto& slots = flat_->slots();
  for (size_t i = 0; i < slots.size(); ++i) {
    const int64_t lo = std::max(begin, slots[i].offset);
    const int64_t hi = std::min(end, slots[i].offset + slots[i].numel);
    if (lo < hi) fragments.push_back({static_cast<int64_t>(i), lo - begin, hi - lo});
  }
  lamb.set_fragments(std::move(fragments), static_cast<int64_t>(slots.size()),
                     [this](at::Tensor& squares) { ownership_->sum_over_owners(squares); });
}

// An inf or NaN in any rank's gradients makes the summed square non-finite on every rank, so this
// one all-reduce is also the overflow vote.
double FlatStage::global_grad_norm() {
  at::Tensor sq = grads_->partition().to(torch::kDouble).pow(2).sum().reshape({1});
  ownership_->sum_over_owners(sq);
  return std::sqrt(sq.item<double>());
}

void FlatStage::step(double grad_scale) {
  shard_->step({grads_->partition()}, *partition_, grad_scale);
  ownership_->share_updates(*flat_);
  grads_->zero();
}

MemoryReport FlatStage::memory() const {
  MemoryReport r;
  r.parameters = storage_bytes(flat_->buffer());
  r.gradients = grads_->gradient_bytes();
  r.optimizer_states = shard_->resident_bytes();
  r.comm_buffers = grads_->comm_buffer_bytes();
  return r;
}

std::unique_ptr<FragmentState> FlatStage::state_to_save() {
  return windowed_fragment_state(ownership_->fragments_to_save(*flat_), shard_->windows_for_save());
}

std::unique_ptr<FragmentState> FlatStage::state_to_load(bool create_moments) {
  return windowed_fragment_state(ownership_->fragments_to_load(*flat_),
                                 shard_->windows_for_load(create_moments));
}

// The loaded masters -> this rank's (16-bit) partition -> every rank.
void FlatStage::finish_load(int64_t adam_step) {
  shard_->finish_load(adam_step, *partition_);
  ownership_->share_updates(*flat_);
}

}  // namespace zero
}  // namespace deepspeed
