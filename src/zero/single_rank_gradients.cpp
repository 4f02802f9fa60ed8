#include "zero/single_rank_gradients.h"

#include <torch/torch.h>

#include <algorithm>

#include "zero/tensor_facts.h"

namespace deepspeed {
namespace zero {

// No bucket is ever launched on the wire, so nothing is held in flight (max_in_flight 0: each
// bucket is finished as it is launched). Every gradient is caught as it is produced, to free it.
SingleRankGradients::SingleRankGradients(const StageContext& context, FlatParams& flat,
                                         const ReductionOptions& options,
                                         at::ScalarType comm_dtype, at::ScalarType grad_dtype)
    : FlatGradReducer(context, flat, /*owner=*/0, options, comm_dtype, /*max_in_flight=*/0,
                      /*hooked=*/true),
      scaling_(reduce_scatter_scaling(options, /*world_size=*/1, comm_dtype)),
      written_(flat.slots().size(), false) {
  TORCH_CHECK(context.world_size() == 1, "SingleRankGradients: data-parallel world size ",
              context.world_size(), ", not 1");
  const int64_t numel = flat_.layout().partition_numel;
  auto partition = std::make_unique<DeviceGradPartition>(
      numel, grad_dtype, ctx_.device, releases_gradients(options, ctx_.device));
  device_partition_ = partition.get();
  partition_ = std::move(partition);
  std::vector<ElementRange> covered;
  for (const auto& slot : flat_.slots())
    covered.emplace_back(slot.offset - flat_.layout().begin(owner_), slot.numel);
  gaps_ = uncovered(std::move(covered), numel, "SingleRankGradients");
}

void SingleRankGradients::zero() {
  cleared_ = true;
  drop_accumulated_grads();
  device_partition_->release();
}

// As ReduceScatterBuckets: every micro-step "reduces" (here: writes or adds); at stage 1 only
// the boundary's.
void SingleRankGradients::begin_backward(bool boundary) {
  if (leaves_to_autograd(boundary)) return;
  abandon_backward();  // a failed pass's recovery first (drop_unlaunched)
  overwrite_ = cleared_;
  cleared_ = false;
  written_.assign(written_.size(), false);
  start(/*reducing=*/true, boundary);
}

at::Tensor SingleRankGradients::slot_in_partition(size_t slot_index) {
  const auto& slot = flat_.slots()[slot_index];
  return writable_partition().narrow(0, slot.offset - flat_.layout().begin(owner_), slot.numel);
}

// A released partition is allocated again at the writing micro-step's first use, uninitialized:
// every slot is written or zeroed before the step reads it; the gaps no slot covers are zeroed
// now. (Adding into a released partition cannot happen: the micro-step after zero() writes, and
// it leaves the partition allocated; tensor() would allocate zeros.)
const at::Tensor& SingleRankGradients::writable_partition() {
  if (!overwrite_ || device_partition_->holds_memory()) return device_partition_->tensor();
  const at::Tensor& fresh = device_partition_->acquire_uninitialized();
  for (const auto& [begin, n] : gaps_) fresh.narrow(0, begin, n).zero_();
  return fresh;
}

// The slot's .grad (when it has one) into the partition, freed at once. The values take the old
// path's roundings: the bucket's dtype (communication_data_type), each scaling factor in it, then
// the partition's dtype in the write or the add.
void SingleRankGradients::take_grad(size_t slot_index) {
  auto& g = flat_.slots()[slot_index].param.mutable_grad();
  if (!g.defined()) return;
  at::Tensor values = g.reshape({-1});
  const bool scaled = scaling_.before_reduce != 1.0 || scaling_.after_reduce != 1.0;
  if (values.scalar_type() != comm_dtype_ || scaled) {
    // A copy (never autograd's tensor scaled in place); the largest is reported with the comm
    // buffers, as a bucket's copy in communication_data_type is at stages 0/1.
    values = values.to(comm_dtype_, /*non_blocking=*/false, /*copy=*/true);
    peak_wire_bytes_ = std::max(peak_wire_bytes_, storage_bytes(values));
  }
  if (scaling_.before_reduce != 1.0) values.mul_(scaling_.before_reduce);
  if (scaling_.after_reduce != 1.0) values.mul_(scaling_.after_reduce);
  at::Tensor place = slot_in_partition(slot_index);
  if (overwrite_ && !written_[slot_index])
    place.copy_(values);
  else
    place.add_(values);
  written_[slot_index] = true;
  g = at::Tensor();
}

// Every parameter of the bucket is ready. A parameter whose hook did not fire may still hold a
// gradient from backwards that did not reduce (a pipeline stage's micro-batches before the last
// accumulate in .grad): it goes in now. On a writing micro-step one with no gradient at all is
// zeroed, as the old path's zeroed bucket added nothing to a zeroed partition. The padding and
// the alignment gaps between slots are never written: zeros since they were allocated.
void SingleRankGradients::launch(Bucket& b) {
  for (size_t s : b.range.slots) {
    take_grad(s);
    if (overwrite_ && !written_[s]) {
      slot_in_partition(s).zero_();
      written_[s] = true;
    }
  }
}

// After a backward that threw (and at every begin_backward, where there is nothing to do after a
// pass that completed): a writing micro-step left the parameters it did not reach holding an
// earlier step's gradients; they are zeroed, and what it wrote stays, to be added to.
void SingleRankGradients::drop_unlaunched() {
  if (!overwrite_) return;
  for (size_t s = 0; s < written_.size(); ++s)
    if (!written_[s]) {
      slot_in_partition(s).zero_();
      written_[s] = true;
    }
  overwrite_ = false;
}

}  // namespace zero
}  // namespace deepspeed
