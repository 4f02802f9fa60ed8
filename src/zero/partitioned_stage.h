// ZeRO stages 1 and 2 over one flat fp32 buffer of the trainable parameters (FlatParams).
//
// Each rank owns partition r of the buffer. The partition of the parameter buffer itself is the
// fp32 master copy (no second copy in fp32 training); the optimizer holds moments only for it.
//   stage 1: gradients live in a full flat gradient buffer (the parameters' .grad are views of it);
//            at the accumulation boundary each bucket is all-reduced in place; the rank's slice
//            of the averaged gradient feeds its optimizer.              bytes: 4Ψ + 4Ψ + 8Ψ/N
//   stage 2: no full gradient buffer. As backward produces a parameter's gradient, it is copied
//            into its bucket and freed; a complete bucket is reduce-scattered (uneven splits: each
//            rank receives the part of the bucket inside its partition) and added to the rank's
//            contiguous gradient partition. Every micro-step reduces.   bytes: 4Ψ + 4Ψ/N + 8Ψ/N
// After the optimizer step the updated partitions are all-gathered back into the buffer, in
// chunks of allgather_bucket_size elements.
#pragma once
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

class PartitionedStage : public ZeroStage {
 public:
  // `make_optimizer` builds the optimizer over the rank's master partition.
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
    comm::WorkPtr work;
  };
  void on_grad_ready(size_t slot);
  void launch(Bucket& b);
  void finish(Bucket& b);
  void stage_gradient_into_bucket(size_t slot);
  void point_grads_at_flat_buffer();
  void all_gather_partitions();
  void borrow_buffer(Bucket& b);

  const int stage_;
  comm::CommunicatorPtr comm_;
  Config config_;
  std::unique_ptr<FlatParams> flat_;
  at::Tensor master_;          // this rank's partition of the parameter buffer
  at::Tensor flat_grad_;       // stage 1: full gradient buffer
  at::Tensor grad_partition_;  // this rank's averaged gradient (stage 1: a view of flat_grad_)
  std::shared_ptr<torch::optim::Optimizer> optimizer_;
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
