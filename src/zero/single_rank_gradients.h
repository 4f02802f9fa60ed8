// Stages 1 and 2 at data-parallel world size 1 with the gradient partition on the compute device:
// there is no peer, so nothing is reduced and each gradient goes straight into its place in the
// partition as autograd produces it, then is freed (at stage 1 only at the accumulation
// boundary: the micro-steps before it accumulate in .grad, flat_grad_reducer.h).
// ReduceScatterBuckets would copy it into a bucket of reduce_bucket_size (up to three held: 2.8 GB
// for a 1.3B bf16 model), the single-process reduce-scatter would copy the bucket into a fresh
// buffer and that would be added into the partition: ~18 bytes of memory traffic per parameter
// per micro-step for the same values. Here: no bucket, no collective, no buffer beside the partition.
//
// Same arithmetic, element by element, as that path (so training is bit-identical): the gradient
// is converted to communication_data_type, multiplied by the world-1 scaling factors
// (gradient_scaling.h: 1/f and then f with gradient_predivide_factor f, each rounded in that
// dtype), then written into the partition (grad_accum_dtype) on the first micro-step after zero()
// and added on later ones. Writing instead of adding to a zeroed partition spares zero() its pass;
// it differs only in the sign of a zero (-0 stays -0, where 0 + -0 gave +0).
//
// With zero_optimization.release_gradients (on a GPU by default) zero() frees the partition and
// the writing micro-step allocates it again, uninitialized, at its first gradient (after the
// forward's activations began to be freed): every slot is then written or zeroed, and the gaps
// between slots (alignment, padding) are zeroed as it is allocated.
//
// Buckets (the base's BucketOrder) still mark when a range of the partition is final, for
// on_final; launching one only zeroes, on a writing micro-step, its parameters that got no
// gradient. A backward that throws keeps what it wrote (as a device gradient buffer keeps what a
// failed backward wrote); on a writing micro-step the parameters it did not reach are zeroed then,
// so no earlier step's gradient survives, and the retry adds.
//
// With ZeRO-Offload's host partition the buckets stay (ReduceScatterBuckets): each bucket is what
// goes down to host memory in one copy that the update during backward takes.
#pragma once
#include <vector>

#include "util/ranges.h"
#include "zero/flat_grad_reducer.h"
#include "zero/gradient_scaling.h"

namespace deepspeed {
namespace zero {

class SingleRankGradients : public FlatGradReducer {
 public:
  // `grad_dtype`: the partition's dtype (grad_accum_dtype). REQUIRES: context.world_size() == 1.
  SingleRankGradients(const StageContext& context, FlatParams& flat,
                      const ReductionOptions& options, at::ScalarType comm_dtype,
                      at::ScalarType grad_dtype);
  void begin_backward(bool boundary) override;
  // The next micro-step writes: nothing to zero now (a releasing partition is freed).
  void zero() override;
  int64_t gradient_bytes() const override { return partition_->bytes(); }
  void drop_unlaunched() override;

 private:
  void arrived(size_t slot) override { take_grad(slot); }
  void launch(Bucket& b) override;
  void finish(Bucket& b) override { announce_final(b.range.begin, b.range.end); }
  void take_grad(size_t slot);
  at::Tensor slot_in_partition(size_t slot);
  const at::Tensor& writable_partition();

  const GradientScaling scaling_;
  DeviceGradPartition* device_partition_ = nullptr;  // partition_, as its type
  std::vector<ElementRange> gaps_;                   // what no slot covers (util/ranges.h)
  bool cleared_ = true;     // nothing written since zero() (or ever: the partition is zeros)
  bool overwrite_ = false;  // this micro-step writes: its first since zero()
  std::vector<bool> written_;  // this micro-step's slots already written (or zeroed)
};

}  // namespace zero
}  // namespace deepspeed
