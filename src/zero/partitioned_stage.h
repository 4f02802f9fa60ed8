// ZeRO stages 1 and 2 over one flat buffer of the trainable parameters (FlatParams), in fp32 or
// in 16 bits (bf16/fp16) with fp32 master weights — and stage 0 in 16 bits, which is the same
// machinery with one partition covering the whole buffer.
//
// Each rank owns partition r of the buffer. In fp32 the partition of the parameter buffer itself
// is the master copy (no second copy); in 16 bits master_ is a separate fp32 copy of the partition.
// The optimizer holds moments only for master_.
//   stage 0 (16-bit only): full 16-bit gradient buffer all-reduced in place at the boundary; every
//            rank keeps the full fp32 master and moments.                bytes: 2Ψ + 2Ψ + 12Ψ
//   stage 1: gradients live in a full flat gradient buffer (the parameters' .grad are views of it);
//            at the accumulation boundary each bucket is all-reduced in place; the rank's slice
//            of the averaged gradient feeds its optimizer.   fp32: 4Ψ + 4Ψ + 8Ψ/N, 16-bit: 4Ψ + 12Ψ/N
//   stage 2: no full gradient buffer. As backward produces a parameter's gradient, it is copied
//            into its bucket and freed; a complete bucket is reduce-scattered (uneven splits: each
//            rank receives the part of the bucket inside its partition) and added to the rank's
//            contiguous gradient partition. Every micro-step reduces.
//                                                            fp32: 4Ψ + 12Ψ/N, 16-bit: 2Ψ + 14Ψ/N
// Gradients travel in communication_data_type (default: the gradient dtype). At the step the
// 16-bit gradient partition is widened to a transient fp32 copy for the optimizer; the fused Adam
// writes the updated master and its 16-bit rounding into the parameter buffer in one pass. The
// updated partitions are then all-gathered back into the buffer, in chunks of
// allgather_bucket_size elements.
#pragma once
#include <array>
#include <deque>
#include <memory>
#include <vector>

#include "deepspeed/comm.h"
#include "deepspeed/config.h"
#include "zero/bucket_order.h"
#include "zero/flat_params.h"
#include "zero/gradient_hooks.h"
#include "zero/stage.h"

namespace deepspeed {
namespace zero {

using OptimizerFactory =
    std::function<std::shared_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

struct SwappedOptimizer;

class PartitionedStage : public ZeroStage {
 public:
  // `make_optimizer` builds the optimizer over the rank's master partition. `stage` is 0 (16-bit
  // parameters only), 1 or 2. REQUIRES: every parameter has the same dtype (fp32, bf16 or fp16).
  PartitionedStage(int stage, std::vector<at::Tensor> params, comm::CommunicatorPtr comm,
                   const Config& config, const OptimizerFactory& make_optimizer);
  ~PartitionedStage() override;

  void begin_backward(bool boundary) override;
  void end_backward(bool boundary) override;
  double global_grad_norm() override;
  void step(double grad_scale) override;
  void discard_gradients() override;
  MemoryReport memory() const override;
  std::shared_ptr<torch::optim::Optimizer> optimizer() const override { return optimizer_; }
  // Checkpoints: partitioned_stage_checkpoint.cpp.
  std::vector<StateFragment> fragments_to_save() override;
  std::vector<StateFragment> fragments_to_load(bool create_moments) override;
  int64_t adam_step() const override;
  void finish_load(int64_t adam_step) override;
  void refresh_masters_from_model() override;

  const FlatParams& flat() const { return *flat_; }

 private:
  struct Bucket {
    BucketRange range;
    at::Tensor pooled;    // stage 2: the full-size pool buffer lent to this bucket
    at::Tensor buffer;    // stage 2: its first (end - begin) elements: the bucket's gradients
    at::Tensor received;  // stage 2: this rank's reduced part
    at::Tensor wire;      // stages 0/1: the bucket converted to communication_data_type
    comm::WorkPtr work;
  };
  void on_grad_ready(size_t slot);
  void launch(Bucket& b);
  void finish(Bucket& b);
  void stage_gradient_into_bucket(size_t slot);
  void point_grads_at_flat_buffer();
  // Makes every rank's parameters equal to the masters: writes master_ into this rank's 16-bit
  // partition (unless the fused optimizer already did: copy_master = false), then all-gathers.
  void all_gather_partitions(bool copy_master = true);
  bool mixed_precision() const { return param_dtype_ != at::kFloat; }
  bool partitioned() const { return stage_ >= 1; }
  at::Tensor own_partition() const;
  std::array<at::Tensor, 3> state_tensors(bool create_moments);
  std::vector<StateFragment> fragments_over(const std::array<at::Tensor, 3>& state);
  void borrow_buffer(Bucket& b);

  const int stage_;
  comm::CommunicatorPtr comm_;
  Config config_;
  at::ScalarType param_dtype_ = at::kFloat;
  at::ScalarType comm_dtype_ = at::kFloat;  // gradients travel in this dtype
  bool fused_half_copy_ = false;  // the optimizer writes the 16-bit partition itself
  std::unique_ptr<FlatParams> flat_;
  at::Tensor master_;          // fp32: this rank's partition of the buffer; 16-bit: its fp32 copy
  at::Tensor flat_grad_;       // stages 0/1: full gradient buffer (parameter dtype)
  at::Tensor grad_partition_;  // this rank's averaged gradient (stages 0/1: a view of flat_grad_)
  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  // offload_optimizer nvme (zero/swapped_optimizer.h): masters and moments in a file.
  std::unique_ptr<SwappedOptimizer> swapped_;
  // While a checkpoint loads into the swapped optimizer: the state the fragments write into.
  std::array<at::Tensor, 3> swapped_loading_;
  std::vector<Bucket> buckets_;
  std::unique_ptr<BucketOrder> order_;
  std::vector<at::Tensor> pool_;  // stage 2: free bucket buffers, reused across micro-steps
  int64_t pool_bytes_ = 0;
  int64_t max_bucket_numel_ = 0;  // every pool buffer has this size, so any buffer fits any bucket
  std::deque<size_t> in_flight_;  // launched, not yet finished, oldest first
  bool reducing_ = false;
  GradientHooks hooks_;
};

}  // namespace zero
}  // namespace deepspeed
