// The gradient-reduction part of the flat stages (0 in 16 bits, 1, 2): it turns the gradients
// autograd produces for the parameters of a FlatParams buffer into this rank's averaged gradient
// partition. Buckets are contiguous runs of the buffer (make_bucket_ranges), launched strictly in
// order on every rank (BucketOrder) and finished through the shared InFlight queue.
//
//   AllReduceBuckets (stage 0; stage 1 in a pipeline, whose tied layers sum whole gradients, or
//       accumulating wider than its parameters, build_engine.cpp): one full gradient buffer
//       accumulates the micro-steps; at the accumulation boundary each bucket is all-reduced in
//       place (in communication_data_type when it differs). The partition is a view of the
//       buffer. In the parameter dtype the parameters' .grad are views of it, so autograd
//       accumulates in place; in a wider grad_accum_dtype (bf16 stage 0's fp32, as DeepSpeed's
//       BF16_Optimizer) each gradient is added into it as autograd produces it and freed.
//                                                                gradient bytes: 2 or 4 Ψ
//   ReduceScatterBuckets (stage 2, and stage 1 below): no full gradient buffer. As backward
//       produces a parameter's gradient it is copied into its bucket and freed; a complete
//       bucket is reduce-scattered (uneven splits: each rank receives the part inside its
//       partition) and added to the contiguous gradient partition. Every micro-step reduces (a
//       pipeline stage: only the last micro-batch's; the earlier ones accumulate in .grad, taken
//       as the hook fires or, for a parameter that last backward does not use, as its bucket
//       launches).
//                                                                gradient bytes: Ψ/N + buckets
//       With zero_optimization.release_gradients (a GPU's default) the partition and the bucket
//       pool are freed after each step and allocated again by the next backward.
//       With ZeRO-Offload's host update (ShardOptimizer::gradients_in_host_memory) the partition
//       is in host memory and the reduced buckets go down into it (host_grad_partition.h): on the
//       device only the buckets.
//       Stage 1 (reduce_at_boundary_only) is the same with one reduction per accumulation: the
//       micro-steps before the boundary accumulate in the parameters' .grad (autograd's, 2Ψ
//       between micro-steps), and the boundary's backward moves the sums into the buckets as
//       they arrive. DeepSpeed's stage 1 also reduces only at the boundary and keeps only its
//       partition of the result; its buckets are all-reduced, these reduce-scattered (half the
//       bytes on the wire). Between steps no gradient is held.
//                                                  gradient bytes: Ψ/N + buckets (+ 2Ψ of .grad
//                                                  between the micro-steps of an accumulation)
//   SingleRankGradients (stages 1 and 2 at data-parallel world size 1, device partition):
//       nothing to reduce; each gradient goes straight into the partition
//       (single_rank_gradients.h).
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "zero/bucket_order.h"
#include "zero/flat_params.h"
#include "zero/gradient_hooks.h"
#include "zero/grad_partition.h"
#include "zero/in_flight.h"
#include "zero/stage_options.h"

namespace deepspeed {
namespace zero {

class FlatGradReducer {
 public:
  virtual ~FlatGradReducer();
  // Around loss.backward(); COLLECTIVE at a boundary (and every micro-step for the scatterer).
  virtual void begin_backward(bool boundary) = 0;
  // After begin_backward: the parameters the graph of `root` cannot reach are ready now
  // (BackwardReach, BucketOrder::mark_unreachable), when this backward's hooks launch buckets.
  void expect_gradients_from(const at::Tensor& root);
  void end_backward();
  // Before a backward: if the last one threw midway, its launched buckets are finished (every
  // rank launched them in the same order; their sums stay in the gradients, as a device buffer
  // keeps what a failed backward wrote) with no range announced final, and the buckets it filled
  // but did not launch are dropped (launching one now would need every rank's part).
  // Called by the stage on a failed backward (ZeroStage::abandon_backward) and by every
  // begin_backward (a no-op after a pass that completed).
  void abandon_backward();

  // This rank's averaged gradients (its partition of the buffer), valid after a boundary's
  // end_backward until zero() (in host memory: once settle() returned).
  const at::Tensor& partition() const { return partition_->tensor(); }
  // Host readers of partition() first wait for its downloads (nothing to wait for on the device).
  void settle() { partition_->wait(); }
  // The partition's sum of squares: fp64 [1] on the device, a fresh tensor.
  at::Tensor squared_norm() { return partition_->squared_norm(); }
  virtual void zero() = 0;             // drops the gradients (after a step, or an overflow)
  // At an accumulation boundary, `fn(begin, numel, ready)` runs (on the backward thread) as each
  // range of the partition becomes final, its bucket reduced: ZeRO-Offload updates it at once.
  // `ready`: with the partition in host memory, the fence of its download (else null).
  using OnFinal = std::function<void(int64_t, int64_t, std::shared_ptr<device::CopyFence>)>;
  void on_final(OnFinal fn) { on_final_ = std::move(fn); }
  // Stage 1 (the scatterers only): reduce at the accumulation boundary alone. The micro-steps
  // before it are not caught: autograd accumulates them in the parameters' .grad, and the
  // boundary's hooks take the sums (as a pipeline stage's earlier micro-batches are taken).
  void reduce_at_boundary_only() { every_micro_step_ = false; }
  virtual int64_t gradient_bytes() const = 0;
  bool gradients_on_host() const { return partition_->in_host_memory(); }
  // The bucket pool, the all-reduce buckets' copies in communication_data_type and the
  // partition's transfer temporaries (peaks), and of them those in host memory (a pageable host
  // partition's page-locked copies).
  int64_t comm_buffer_bytes() const {
    return pool_bytes_ + peak_wire_bytes_ + partition_->device_temporary_bytes() +
           host_comm_buffer_bytes();
  }
  int64_t host_comm_buffer_bytes() const { return partition_->host_temporary_bytes(); }

 protected:
  struct Bucket {
    BucketRange range;
    at::Tensor pooled;    // scatterer: the full-size pool buffer lent to this bucket
    at::Tensor buffer;    // scatterer: its first (end - begin) elements, the bucket's gradients
    at::Tensor received;  // scatterer: this rank's reduced part
    at::Tensor wire;      // all-reduce: the bucket converted to communication_data_type
    comm::WorkPtr work;
  };
  // `hooked`: catch every gradient as autograd produces it (overlap, or to take it at once);
  // `launch_from_hooks`: a bucket whose gradients all arrived is launched then (overlap).
  FlatGradReducer(const StageContext& context, FlatParams& flat, int owner,
                  const ReductionOptions& options, at::ScalarType comm_dtype, size_t max_in_flight,
                  bool hooked, bool launch_from_hooks = true);
  void start(bool reducing, bool boundary);
  virtual void drop_unlaunched() {}
  // Buffer elements [begin, end) are final: on_final gets their part of the partition.
  void announce_final(int64_t begin, int64_t end,
                      std::shared_ptr<device::CopyFence> ready = nullptr);
  virtual void arrived(size_t slot) {}
  virtual void launch(Bucket& b) = 0;
  virtual void finish(Bucket& b) = 0;
  void launch_index(size_t b);

  StageContext ctx_;
  FlatParams& flat_;
  const int owner_;  // the partition this rank owns: its rank, or 0 when unpartitioned
  ReductionOptions options_;
  at::ScalarType comm_dtype_;  // gradients travel in this dtype
  std::unique_ptr<GradPartition> partition_;
  std::vector<Bucket> buckets_;
  std::unique_ptr<BucketOrder> order_;
  InFlight in_flight_;
  int64_t pool_bytes_ = 0;
  // All-reduce: the most bytes of Bucket::wire alive at once. SingleRankGradients: its largest
  // gradient copy in communication_data_type.
  int64_t peak_wire_bytes_ = 0;
  bool catching_ = false;  // between begin_backward and end_backward: arrived() takes gradients
  bool reducing_ = false;
  bool launch_from_hooks_ = true;
  bool boundary_ = false;  // this backward ends an accumulation: what it reduces is final
  bool every_micro_step_ = true;  // false: reduce_at_boundary_only()
  // A micro-step the scatterer leaves to autograd (reduce_at_boundary_only, not the boundary):
  // what failed before it is recovered, and nothing is caught.
  bool leaves_to_autograd(bool boundary) {
    if (every_micro_step_ || boundary) return false;
    abandon_backward();
    return true;
  }
  // After a step, or a discarded one: .grad that micro-steps before the boundary left (a discard
  // during an accumulation) go with the partition's gradients.
  void drop_accumulated_grads();
  OnFinal on_final_;
  GradientHooks hooks_;
};

class AllReduceBuckets : public FlatGradReducer {
 public:
  // `grad_dtype`: the buffer's dtype, where the micro-steps accumulate (grad_accum_dtype).
  AllReduceBuckets(const StageContext& context, FlatParams& flat, int owner,
                   const ReductionOptions& options, at::ScalarType comm_dtype,
                   at::ScalarType grad_dtype);
  void begin_backward(bool boundary) override;
  void zero() override { flat_grad_.zero_(); }
  int64_t gradient_bytes() const override;

 private:
  void arrived(size_t slot) override;
  void launch(Bucket& b) override;
  void finish(Bucket& b) override;
  void point_grads_at_buffer();
  void take_grad(size_t slot);
  at::Tensor range_of(const Bucket& b);
  at::Tensor flat_grad_;  // the full gradient buffer, in the accumulation dtype
  bool wider_ = false;    // flat_grad_ is not in the parameter dtype: .grad are not its views
};

class ReduceScatterBuckets : public FlatGradReducer {
 public:
  // `grad_dtype`: the partition's dtype (grad_accum_dtype, may be wider than the parameters').
  // `host_partition`: the partition in host memory (page-locked with `pin`): grad_partition.h.
  ReduceScatterBuckets(const StageContext& context, FlatParams& flat, const ReductionOptions& options,
                       at::ScalarType comm_dtype, at::ScalarType grad_dtype, bool host_partition,
                       bool pin);
  void begin_backward(bool boundary) override;
  void zero() override;
  int64_t gradient_bytes() const override;
  void drop_unlaunched() override;

 private:
  void arrived(size_t slot) override;
  void launch(Bucket& b) override;
  void finish(Bucket& b) override;
  void borrow_buffer(Bucket& b);
  void take_grad(Bucket& b, size_t slot);
  std::vector<at::Tensor> pool_;  // free bucket buffers, reused across micro-steps
  int64_t max_bucket_numel_ = 0;  // every pool buffer has this size, so any fits any bucket
  // zero_optimization.release_gradients: zero() frees the pool with the partition (DeepSpeed's
  // _release_ipg_buffers drops its ipg_buffer too). pool_bytes_ is then the most held at once.
  bool release_ = false;
  int64_t pool_held_bytes_ = 0;
};

}  // namespace zero
}  // namespace deepspeed
