// ZeRO stages 0 (16-bit), 1 and 2: the trainable parameters in one flat buffer (FlatParams),
// composed of three parts chosen once by the builder:
//   - who owns what (flat_ownership.h): sharded partitions all-gathered after the step (1, 2;
//     with overlap_param_gather into the next forward, zero/param_gather.h), or one replicated
//     partition (0);
//   - how gradients are reduced (flat_grad_reducer.h): all-reduce at the boundary (0; 1 in a
//     pipeline or accumulating wider than its parameters), reduce-scatter at the boundary (1) or
//     reduce-scatter every micro-step (2);
//   - the shard optimizer (shard_optimizer.h): fp32 masters and moments in memory or on NVMe.
// Bytes per parameter, Ψ parameters over N ranks:
//   stage 0 (16-bit): 2Ψ + 2Ψ + 12Ψ;  stage 2: fp32 4Ψ + 12Ψ/N, 16-bit 2Ψ + 14Ψ/N;
//   stage 1: as stage 2, plus the parameters' .grad between the micro-steps of an accumulation
//   (fp32 4Ψ, 16-bit 2Ψ); all-reducing, the paper's: fp32 4Ψ + 4Ψ + 8Ψ/N, 16-bit 2Ψ + 2Ψ (4Ψ
//   in an fp32 buffer) + 12Ψ/N.
// In fp32 the partition of the parameter buffer is itself the master copy. The fused Adam writes
// the updated master and its 16-bit rounding into the parameter buffer in one pass; the updated
// partitions are then all-gathered back into the buffer.
// 1-bit Adam, 0/1 Adam and 1-bit Lamb in 16 bits (stage 0 only; the config refuses them with
// ZeRO) step the one flat fp32 master, as DeepSpeed's FP16_Optimizer does for the Adams (its
// 1-bit Lamb keeps per-parameter masters; here Lamb's fragments and the segments, both in the
// model's parameter order, give it per-parameter views). While the optimizer says
// gradients_stay_local() (optim/self_communicating.h) the boundary reduces nothing, and the fp16
// overflow check becomes a vote across ranks (global_grad_norm).
#pragma once
#include <memory>
#include <vector>

#include "optim/self_communicating.h"
#include "zero/flat_grad_reducer.h"
#include "zero/flat_ownership.h"
#include "zero/flat_params.h"
#include "zero/forward_waits.h"
#include "zero/shard_optimizer.h"
#include "zero/stage.h"
#include "zero/stage_options.h"

namespace deepspeed {
namespace optim {
class Lamb;
}
namespace zero {

class FlatStage : public ZeroStage {
 public:
  // `make_optimizer` builds the optimizer over the rank's fp32 master partition. `model`: the
  // module the parameters belong to, whose ZeroUnits wait for their own parameters with
  // offload_optimizer.overlap_forward or overlap_param_gather (zero/forward_waits.h); null: the
  // whole update is waited for when a forward begins.
  // REQUIRES: every parameter has options.param_dtype.
  FlatStage(std::vector<at::Tensor> params, const StageContext& context,
            const FlatStageOptions& options, const OptimizerFactory& make_optimizer,
            torch::nn::Module* model = nullptr);

  // At a boundary the gradients are reduced, unless a 1-bit optimizer keeps them local.
  // The shard first: an update still running from an earlier boundary stops before the gradients'
  // recovery touches what it reads. Ranges that recovery finishes (a failed pass's buckets) are
  // refused until this backward has begun.
  void begin_backward(bool boundary) override {
    complete_step();
    shard_->begin_backward();
    grads_->begin_backward(boundary && !gradients_stay_local());
    shard_->accept_ranges();
  }
  void expect_gradients_from(const at::Tensor& root) override {
    grads_->expect_gradients_from(root);
  }
  void end_backward(bool) override { grads_->end_backward(); }
  void abandon_backward() override {
    shard_->abandon_step();
    grads_->abandon_backward();
  }
  // COLLECTIVE. Non-finite on every rank when any rank's gradients hold an inf or NaN.
  double global_grad_norm() override;
  at::Tensor global_grad_norm_tensor() override;
  at::Tensor grad_square_sums(const std::vector<at::Tensor>& selected) override;
  at::Tensor agreed_across_data_ranks(at::Tensor norm) override;
  void step(double grad_scale) override;
  void discard_gradients() override {
    complete_step();
    shard_->discard_step();
    grads_->zero();
  }
  // offload_optimizer.overlap_forward: the update handed over by step() ends here (its
  // gradients, read until then, are dropped now); overlap_param_gather: the all-gather of the
  // updated partitions launched by step() is finished here.
  void complete_step() override;
  bool step_handed_over() const override;
  void before_forward() override;
  MemoryReport memory() const override;
  std::shared_ptr<torch::optim::Optimizer> optimizer() const override { return shard_->optimizer(); }
  // Checkpoints: the shard's state as fragments of the owner's partition.
  std::unique_ptr<FragmentState> state_to_save() override;
  std::unique_ptr<FragmentState> state_to_load(bool create_moments) override;
  int64_t adam_step() const override { return shard_->adam_step(); }
  void finish_load(int64_t adam_step) override;
  void refresh_masters_from_model() override { shard_->refresh_masters(*partition_); }
  bool replicated_state() const override { return ownership_->parts() == 1; }

  const FlatParams& flat() const { return *flat_; }
  // Ranges of the partition the last step updated during backward (offload_optimizer.overlap_step).
  bool steps_during_backward() const override { return shard_->steps_during_backward(); }
  size_t ranges_stepped_during_backward() const override {
    return shard_->ranges_stepped_during_backward();
  }
  bool update_begun_during_backward() const override {
    return shard_->update_begun_during_backward();
  }
  bool step_lost() const override { return shard_->step_lost(); }
  // Whether step() hands the update's last ranges over to the next forward (tests).
  bool finishes_in_forward() const { return shard_->finishes_in_forward(); }
  // overlap_param_gather's all-gather, null where the step waits for it (tests, logs).
  const ParamGather* overlapped_gather() const { return overlapped_gather_; }

 private:
  ReductionOptions reduction_for(ReductionOptions configured) const;
  std::vector<size_t> slots_in_param_order(const std::vector<at::Tensor>& params) const;
  void tell_lamb_fragments(optim::Lamb& lamb, const std::vector<size_t>& order);
  void tell_segments(optim::SelfCommunicatingOptimizer& onebit, const std::vector<size_t>& order);
  bool gradients_stay_local() const { return self_comm_ && self_comm_->gradients_stay_local(); }

  StageContext ctx_;
  std::unique_ptr<FlatParams> flat_;
  std::unique_ptr<FlatOwnership> ownership_;
  std::unique_ptr<TensorPartition> partition_;  // the owner's slice of the buffer
  std::unique_ptr<FlatGradReducer> grads_;
  std::unique_ptr<ShardOptimizer> shard_;
  const optim::SelfCommunicatingOptimizer* self_comm_ = nullptr;  // the optimizer when it is one
  // overlap_forward (one rank) or overlap_param_gather (peers), with a model given
  std::unique_ptr<ForwardWaits> forward_waits_;
  // overlap_param_gather: step() launches it, the next forward settles it (owned by ownership_)
  ParamGather* overlapped_gather_ = nullptr;
  bool zero_after_update_ = false;  // the handed-over update still reads the gradients
  // Stage 1 with gradient_accumulation_steps > 1: the .grad autograd holds between micro-steps
  // (counted with the gradients in the memory report).
  int64_t accumulating_grad_bytes_ = 0;
};

}  // namespace zero
}  // namespace deepspeed
