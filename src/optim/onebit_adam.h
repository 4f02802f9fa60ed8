// 1-bit Adam (Tang et al. 2021), as DeepSpeed's OnebitAdam (runtime/fp16/onebit/adam.py), at ZeRO
// stage 0 in fp32:
//   warm-up, steps 1 .. max(freeze_step, 1): exactly FusedAdam with adam_w_mode and no bias
//     correction (OnebitAdam's update m/(sqrt(v)+eps) + wd·p, p -= lr·update, which is AdamW's
//     without bias correction), on gradients the stage all-reduced as for Adam: bit for bit the
//     run "type": "Adam", "bias_correction": false would make.
//   after: the variance v is frozen; the stage leaves gradients local (self_communicating.h);
//     each rank updates its momentum m = β1·m + (1-β1)·g with its own gradient, and the momenta
//     are averaged with the error-compensated compressed all-reduce (compressed_allreduce.h), so
//     every rank holds the same m; then p -= lr·(m/(sqrt(v)+eps) + wd·p).
// Differences from DeepSpeed, on purpose: DeepSpeed's first step() only initialises state
// (moments, no parameter update); here step 1 is an ordinary Adam step. All tensors are
// compressed together (one all-to-all and one all-gather per step, each tensor keeping its own
// scales) where DeepSpeed issues four collectives per tensor. exp_avg_mask: momentum_mask.h.
// Checkpoints: the state is FusedAdam's (step, exp_avg, exp_avg_sq = the frozen variance), saved
// and resharded as Adam's; the error-feedback buffers are saved per rank (extra_state.h) and
// restored at the same world size, so a resumed run continues bit for bit. At another world size
// they restart at zero, as DeepSpeed resets them on every load.
// In 16 bits it steps the flat fp32 master of zero/flat_stage.h, one segment per parameter
// (self_communicating.h), and the stage scales the gradients before the step.
// REQUIRES: contiguous fp32 parameters, on the CPU or one GPU (the exchange runs as tensor
// operations there: compressed_allreduce.h); grad scaling done by the stage (not set_grad_scale).
// step() is COLLECTIVE after the warm-up.
#pragma once
#include <memory>

#include "deepspeed/comm.h"
#include "optim/compressed_allreduce.h"
#include "optim/extra_state.h"
#include "optim/momentum_mask.h"
#include "optim/fused_adam.h"
#include "optim/optimizer_params.h"
#include "optim/self_communicating.h"

namespace deepspeed {
namespace optim {

class OneBitAdam : public FusedAdam,
                   public SelfCommunicatingOptimizer,
                   public ExtraOptimizerState,
                   public MomentumMasks {
 public:
  OneBitAdam(std::vector<torch::Tensor> params, const OneBitAdamHyper& hyper,
             comm::CommunicatorPtr comm);
  torch::Tensor step(LossClosure closure = nullptr) override;
  bool gradients_stay_local() const override { return frozen(); }
  std::string extra_state_kind() const override { return "OneBitAdam"; }
  ExtraState extra_state() const override;
  void load_extra_state(const ExtraState& saved) override;
  int64_t extra_state_bytes() const override;

  // Steps taken (the state's count; 0 before the first).
  int64_t steps() const;
  bool frozen() const { return steps() >= std::max<int64_t>(hyper_.freeze_step, 1); }
  // The compressor once frozen (null before): its error-feedback buffers, for tests.
  const CompressedAllReduce* compressor() const { return compressor_.get(); }

 private:
  void compressed_step();

  OneBitAdamHyper hyper_;
  comm::CommunicatorPtr comm_;
  std::unique_ptr<CompressedAllReduce> compressor_;
  int64_t last_step_ = -1;  // the step count this optimizer last wrote
};

}  // namespace optim
}  // namespace deepspeed
