// 0/1 Adam (Lu et al. 2022), as DeepSpeed's ZeroOneAdam (runtime/fp16/onebit/zoadam.py), at ZeRO
// stage 0 in fp32. Two phases, switched after step var_freeze_step + 1 (DeepSpeed's count):
//
//  1. Adaptive variance freezing (steps 1 .. var_freeze_step + 1). Step t is a *variance step* when
//     t % var_interval == 0: gradients are all-reduced in full precision by the stage and the
//     step is exactly Adam without bias correction (FusedAdam, as 1-bit Adam's warm-up). Other
//     steps keep the variance and average the gradients with the 1-bit compressed all-reduce
//     (compressed_allreduce.h) instead: m = β1·m + (1-β1)·C(g). var_interval starts at 1 and
//     doubles after every var_update_scaler variance steps.
//  2. 1-bit sync with local steps (the variance is frozen). Every step
//     is local: m = β1·m + (1-β1)·g with this rank's own gradient, p -= lr·(m/(sqrt(v)+eps) +
//     wd·p), and the update is also accumulated into u (Σ of -lr·update). Every local_interval
//     steps the ranks synchronise: u is brought to momentum units (u ·= sqrt(v)+eps), averaged
//     with the compressed all-reduce, the momentum becomes -u/Σlr, and p = p_sync +
//     u/(sqrt(v)+eps) with p_sync the parameters at the last sync (DeepSpeed computes p - u +
//     u/(...), equal in exact arithmetic; going back to p_sync keeps the ranks bit-identical
//     where p - u leaves each its own rounding residue; costs one copy of the parameters). Steps between syncs issue no collective at all.
//     local_interval starts at 1 and doubles after every local_step_scaler steps, up to
//     local_step_clipper.
// The error-feedback buffers serve both phases and are zeroed once at the switch (as DeepSpeed).
// Differences from DeepSpeed, on purpose: its first step() only initialises state; here step 1
// is a variance step. At world size 1 the compressed all-reduce is the identity (DeepSpeed skips
// the momentum update of non-variance steps there). All tensors are compressed in one call.
// Checkpoints: step, momentum and variance are saved as Adam's; the interval counters are
// recomputed from the step count on load. Each rank's own state is saved beside it (extra_state.h):
// the error feedback and, in phase 2, its parameters, momentum, local updates u, Σlr and the
// parameters of the last sync, so a run resumed at the same world size continues bit for bit
// wherever it was saved. At another world size that state restarts (error feedback zero, u
// empty), so a checkpoint taken between two syncs then loses the local updates not yet
// synchronised: save at a sync step when you mean to reshard (docs/config.md). That per-rank state
// is laid out per parameter in the model's order in every precision (in 16 bits per segment of
// the master, whose buffer holds the parameters reversed and padded), so a checkpoint moves
// between bf16/fp16 and fp32 at the same world size; one of the earlier layout (no "layout"
// entry) is refused by name.
// exp_avg_mask (momentum_mask.h) multiplies the compressed gradient average of phase 1 and the
// exchanged local updates of phase 2.
// In 16 bits it steps the flat fp32 master of zero/flat_stage.h, one segment per parameter
// (self_communicating.h).
// REQUIRES: contiguous fp32 parameters on the CPU or one GPU; grad scaling done by the stage.
// step() is COLLECTIVE.
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

class ZeroOneAdam : public FusedAdam,
                    public SelfCommunicatingOptimizer,
                    public ExtraOptimizerState,
                    public MomentumMasks {
 public:
  ZeroOneAdam(std::vector<torch::Tensor> params, const ZeroOneAdamHyper& hyper,
              comm::CommunicatorPtr comm);
  torch::Tensor step(LossClosure closure = nullptr) override;
  // Local gradients for every step but the variance steps of phase 1.
  bool gradients_stay_local() const override;
  std::string extra_state_kind() const override { return "ZeroOneAdam"; }
  ExtraState extra_state() const override;
  void load_extra_state(const ExtraState& saved) override;
  int64_t extra_state_bytes() const override;

  int64_t steps() const;
  bool frozen() const { return steps() > hyper_.var_freeze_step; }
  int64_t var_interval() const { return var_interval_; }
  int64_t local_interval() const { return local_interval_; }

 private:
  struct Param {
    at::Tensor p;
    torch::optim::AdamWParamState* state;
    const torch::optim::AdamWOptions* options;
  };
  std::vector<Param> params_with_state();
  void compress(const std::vector<at::Tensor>& tensors);
  void apply_masks(std::vector<at::Tensor>& tensors) const;
  void compressed_gradient_step();
  void local_step(int64_t step);
  // Replays the interval schedule up to `steps` (after a checkpoint load).
  void replay_schedule(int64_t steps);
  void advance_schedule(int64_t step);

  ZeroOneAdamHyper hyper_;
  comm::CommunicatorPtr comm_;
  std::unique_ptr<CompressedAllReduce> compressor_;
  int64_t var_interval_ = 1, var_counter_ = 0;
  int64_t local_interval_ = 1, local_counter_ = 0;
  double lr_sum_ = 0;          // Σ lr over the local steps since the last sync
  std::vector<at::Tensor> u_;  // Σ of -lr·update since the last sync, per parameter
  std::vector<at::Tensor> synced_;  // the parameters at the last sync (identical on all ranks)
  int64_t last_step_ = 0;      // the step count this optimizer last wrote
};

}  // namespace optim
}  // namespace deepspeed
