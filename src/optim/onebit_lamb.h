// 1-bit Lamb (Li et al. 2021), as DeepSpeed's OnebitLamb (runtime/fp16/onebit/lamb.py), at ZeRO
// stage 0 in fp32. Per tensor p with moments m, v:
//   warm-up, steps 1 .. max(freeze_step, 1): exactly Lamb without bias correction (lamb.h:
//     u = m/(sqrt(v)+eps) + wd·p, ratio = clamp(‖p‖/‖u‖, min_coeff, max_coeff), p -= lr·ratio·u)
//     on gradients the stage all-reduced; every ratio other than 1 also feeds a running average
//     coeff_freeze = coeff_beta·coeff_freeze + (1-coeff_beta)·ratio (from 0, not bias-corrected,
//     as DeepSpeed). At the last warm-up step the variance is copied into a "fresh" variance.
//   after: v is frozen; gradients stay local (self_communicating.h); each rank updates
//     m = β1·m + (1-β1)·g with its own gradient and the momenta are averaged with the
//     error-compensated compressed all-reduce (compressed_allreduce.h). Then, per tensor:
//       g' = (m - β1·m_before)/(1-β1)            the gradient the averaged momentum implies
//       fresh = β2·fresh + (1-β2)·g'²
//       u0 = m/(sqrt(v)+eps);  u = u0 + wd·p
//       factor = max(  (sqrt(v)+eps) / (sqrt(fresh)+eps)  )      (over the tensor's elements)
//       with wd > 0: r = min(1, ‖u0‖/‖u‖), factor = factor·r + (1-r)
//       factor clamped to [factor_min, factor_max], then to last_factor·(1 ± factor_threshold)
//       p -= lr · coeff_freeze · factor · u;  last_factor = factor
// Differences from DeepSpeed, on purpose: its first step() only initialises state; here step 1 is
// an ordinary Lamb step. DeepSpeed rescales every momentum by a per-tensor "scaling_coeff" before
// compressing one flat buffer with a single scale; here each tensor keeps its own scale, which is
// what that rescaling approximates, so there is none. exp_avg_mask: momentum_mask.h.
// Checkpoints: step, m, v as Adam's fragments; fresh variance, coeff_freeze and last_factor as
// replicated extra state (they survive a world-size change); the error feedback per rank
// (extra_state.h). A frozen optimizer that gets no coeff_freeze back (the load skipped the extra
// state, or it came from another optimizer) rebuilds each ratio once, at its next step, as the
// Lamb ratio of the loaded state, clamp(‖p‖/‖m/(sqrt(v)+eps) + wd·p‖), and warns: with 0 every
// frozen step would be p -= 0 (DeepSpeed always has lamb_coeff_freeze in its optimizer state).
// In 16 bits (fp16 with a dynamic loss scale, stage 0) it steps the flat fp32 master of
// zero/flat_stage.h, which names one segment per model parameter (self_communicating.h) and, as
// for Lamb, one fragment per parameter (lamb.h). Everything per tensor above is then per segment:
// the warm-up is Lamb's fragmented step (the same code, so the same bits as "type": "Lamb",
// "bias_correction": false in 16 bits), and the frozen phase computes each segment's factor,
// ratio and update on views of the master, its moments and its fresh variance, and compresses
// the momentum one segment per scale. Elements outside every segment (alignment padding) get no
// update. A skipped fp16 step (overflow; the stage votes across ranks) never reaches step().
// REQUIRES: contiguous fp32 parameters on the CPU or one GPU; grad scaling done by the stage.
// step() is COLLECTIVE after the warm-up.
#pragma once
#include <memory>
#include <vector>

#include "deepspeed/comm.h"
#include "optim/compressed_allreduce.h"
#include "optim/extra_state.h"
#include "optim/momentum_mask.h"
#include "optim/lamb.h"
#include "optim/optimizer_params.h"
#include "optim/self_communicating.h"

namespace deepspeed {
namespace optim {

class OneBitLamb : public Lamb,
                   public SelfCommunicatingOptimizer,
                   public ExtraOptimizerState,
                   public MomentumMasks {
 public:
  OneBitLamb(std::vector<torch::Tensor> params, const OneBitLambHyper& hyper,
             comm::CommunicatorPtr comm);
  torch::Tensor step(LossClosure closure = nullptr) override;
  bool gradients_stay_local() const override { return frozen(); }
  std::string extra_state_kind() const override { return "OneBitLamb"; }
  ExtraState extra_state() const override;
  void load_extra_state(const ExtraState& saved) override;
  int64_t extra_state_bytes() const override;

  int64_t steps() const;
  bool frozen() const { return steps() >= std::max<int64_t>(hyper_.freeze_step, 1); }
  // Per parameter, or per segment in 16 bits (in order): the running average of warm-up ratios and the last frozen-phase
  // factor; the trust ratio applied at the last step is lamb_coeffs() (lamb.h).
  const std::vector<double>& coeff_freeze() const { return coeff_freeze_; }
  const std::vector<double>& last_factor() const { return last_factor_; }
  const CompressedAllReduce* compressor() const { return compressor_.get(); }

 private:
  torch::optim::AdamWParamState& state_or_zeros(const at::Tensor& p);
  // The tensors the per-parameter arithmetic runs on: the parameters, or one view per segment.
  std::vector<at::Tensor> units() const;
  // coeff_freeze_ / last_factor_ sized to units() (segments arrive after construction).
  void size_per_unit();
  void after_warmup_step();
  // coeff_freeze_ from the moments and weights, when frozen without one (see the top).
  void rebuild_coeff_freeze();
  void compressed_step();

  OneBitLambHyper hyper_;
  comm::CommunicatorPtr comm_;
  std::unique_ptr<CompressedAllReduce> compressor_;
  std::vector<double> coeff_freeze_, last_factor_;
  // coeff_freeze_ holds a warm-up's average: this optimizer ended the warm-up, or a load gave it.
  bool coeff_freeze_known_ = false;
  // step() has run on this object since its construction: from then on the segments are fixed.
  bool stepped_ = false;
  std::vector<at::Tensor> fresh_;  // per optimizer tensor: the fresh variance; empty until the
                                   // warm-up ends
};

}  // namespace optim
}  // namespace deepspeed
