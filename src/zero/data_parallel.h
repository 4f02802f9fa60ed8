// ZeRO stage 0: plain data parallelism. Every rank holds full parameters, gradients and optimizer
// states; gradients are summed over ranks in buckets of reduce_bucket_size elements.
//
// With overlap_comm, a gradient-ready hook on each parameter's grad accumulator marks it ready; a
// bucket whose parameters are all ready is all-reduced asynchronously while backward continues.
// Buckets are launched strictly in bucket order on every rank, so ranks always issue the same
// sequence of collectives even if hooks fire in a different order.
//
// A bucket is summed in a flat buffer lent from a small pool and returned once its sums are
// copied back into .grad: at most kMaxBucketsInFlight buckets travel while the next one is
// filled, so the buffers are bounded by the bucket size (3 buffers of the largest bucket per
// dtype), never a second copy of every gradient held through the forward pass. (DeepSpeed's
// allreduce_bucket flattens each bucket and frees it after the sum.)
#pragma once
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "optim/self_communicating.h"
#include "zero/bucket_order.h"
#include "zero/gradient_hooks.h"
#include "zero/in_flight.h"
#include "zero/stage.h"
#include "zero/stage_options.h"

namespace deepspeed {
namespace zero {

class DataParallelStage : public ZeroStage {
 public:
  // `optimizer` steps `params` themselves (the module's parameters are the masters). Null: an
  // engine without an optimizer (for evaluation, at any stage below 3), which the engine never
  // lets backward or step; `params` may then be 16-bit, and nothing but them is allocated.
  DataParallelStage(std::vector<at::Tensor> params, const StageContext& context,
                    const DataParallelOptions& options,
                    std::shared_ptr<torch::optim::Optimizer> optimizer);
  ~DataParallelStage() override;

  void begin_backward(bool boundary) override;
  void expect_gradients_from(const at::Tensor& root) override;
  void end_backward(bool boundary) override;
  void abandon_backward() override;
  double global_grad_norm() override;
  at::Tensor global_grad_norm_tensor() override;
  at::Tensor grad_square_sums(const std::vector<at::Tensor>& selected) override;
  void step(double grad_scale) override;
  void discard_gradients() override;
  MemoryReport memory() const override;
  std::shared_ptr<torch::optim::Optimizer> optimizer() const override { return optimizer_; }
  // Checkpoints: data_parallel_checkpoint.cpp.
  std::unique_ptr<FragmentState> state_to_save() override;
  std::unique_ptr<FragmentState> state_to_load(bool create_moments) override;
  int64_t adam_step() const override;
  void finish_load(int64_t adam_step) override;
  void refresh_masters_from_model() override {}  // the parameters are the masters
  bool replicated_state() const override { return true; }

 private:
  struct Bucket {
    std::vector<size_t> params;  // indices into params_
    int64_t numel = 0;
    at::ScalarType dtype;
    at::Tensor pooled;           // the pool buffer lent from launch to finish
    at::Tensor flat;             // its first `numel` elements: the bucket's gradients
    at::Tensor wire;             // `flat` in communication_data_type while it travels
    comm::WorkPtr work;
  };
  void build_buckets(int64_t bucket_size);
  void launch_bucket(size_t index);
  void launch(Bucket& bucket);
  void finish(Bucket& bucket);
  void borrow_buffer(Bucket& bucket);
  void return_buffer(Bucket& bucket);

  void give_unused_parameters_zero_gradients();
  // The 1-bit seam (optim/self_communicating.h): true while the optimizer exchanges compressed
  // momentum itself, so this step's gradients stay local and no bucket is reduced.
  bool gradients_stay_local() const { return self_comm_ && self_comm_->gradients_stay_local(); }

  std::vector<at::Tensor> params_;
  StageContext ctx_;
  DataParallelOptions options_;
  std::shared_ptr<torch::optim::Optimizer> optimizer_;  // null: an engine without an optimizer
  // Without an optimizer, 16-bit parameters load through fp32 copies: (parameter, copy) from
  // state_to_load to finish_load.
  std::vector<std::pair<at::Tensor, at::Tensor>> widened_for_load_;
  const optim::SelfCommunicatingOptimizer* self_comm_ = nullptr;  // optimizer_ when it is one
  std::vector<Bucket> buckets_;
  std::unique_ptr<BucketOrder> order_;
  // Free bucket buffers, reused across steps. Every buffer of a dtype has the size of that
  // dtype's largest bucket, so any fits any bucket of the dtype.
  std::vector<at::Tensor> pool_;
  std::map<at::ScalarType, int64_t> max_bucket_numel_;
  int64_t pool_bytes_ = 0;  // every buffer the pool ever made (its peak: none is freed)
  int64_t peak_wire_bytes_ = 0;  // the most bytes of Bucket::wire alive at once
  // Overlap or not: while the next bucket is filled the earlier ones travel, as the scattering
  // stages do it (in_flight.h); the bound is what keeps the pool small.
  InFlight in_flight_{kMaxBucketsInFlight};
  bool reducing_ = false;  // inside a boundary backward with overlap_comm
  GradientHooks hooks_;
};

}  // namespace zero
}  // namespace deepspeed
