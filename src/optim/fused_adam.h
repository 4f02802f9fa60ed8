// FusedAdam: Adam/AdamW as a torch::optim::Optimizer whose update is the vectorised one-pass kernel
// (cpu_adam.h), the counterpart of DeepSpeed's FusedAdam / DeepSpeedCPUAdam. Every ZeRO stage uses
// it for "Adam"/"AdamW", so stage 0 and the partitioned stages run the very same arithmetic.
//
// Groups carry torch::optim::AdamWOptions (lr, betas, eps, weight_decay), so LR schedulers and
// OneCycle's beta cycling work through the usual options; per-parameter state is
// torch::optim::AdamWParamState (step, exp_avg, exp_avg_sq).
// REQUIRES: every parameter is a contiguous fp32 tensor (or a 16-bit master, keep_moments_in)
// with a contiguous gradient it can read (reads_grads_of).
#pragma once
#include <unordered_map>
#include <vector>

#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>

#include "deepspeed/optimizer.h"
#include "optim/adam_moments.h"
#include "optim/adam_runs.h"
#include "optim/cpu_adam.h"

namespace deepspeed {
namespace optim {

// The exact-Adam phase of the 1-bit family (OneBitAdam's warm-up, ZeroOneAdam's variance steps):
// their hyperparameters with decoupled weight decay and no bias correction, as DeepSpeed's
// OnebitAdam / ZeroOneAdam update m / (sqrt(v) + eps) + wd * p.
template <class H>
AdamHyper uncorrected_adamw_hyper(const H& h) {
  AdamHyper a;
  a.lr = h.lr;
  a.beta1 = h.beta1;
  a.beta2 = h.beta2;
  a.eps = h.eps;
  a.weight_decay = h.weight_decay;
  a.adamw_mode = true;
  a.bias_correction = false;
  return a;
}

// One parameter's update for one step, cut into ranges that may run at different times and on
// other threads: ZeRO-Offload updates each bucket's range of the host master as soon as its
// gradients are final, during backward (zero/shard_optimizer.cpp). Made by
// FusedAdam::prepare_step, which counts the step once; run() on disjoint ranges may run
// concurrently, and the ranges together give bit for bit what one step() gives (the update is
// elementwise, with the same constants). With several parameter groups over the parameter
// (FusedAdam::set_flat) a range is cut where the groups' segments meet, each part stepped with
// its group's constants.
struct AdamRangeStep {
  AdamStepParams hyper;  // the constants (of the parameter's group; group 0's with `runs`)
  // set_flat's segments with their groups' constants, in order; empty: `hyper` for every element.
  std::vector<AdamHyperRun> runs;
  // The parameter and its moments at element 0: fp32, or a 16-bit master and fp32 or bf16
  // moments (FusedAdam::keep_moments_in).
  AdamBuffers state;
  uint16_t* half = nullptr;  // the 16-bit copy (set_half_copy), or null
  Half16Kind kind = Half16Kind::BF16;
  // Updates elements [begin, begin + n); grad[0] is element begin's gradient, in `format` (16-bit
  // ones widened in cache: the same result as on the widened values).
  void run_grads(const void* grad, AdamElem format, int64_t begin, int64_t n) const;
  // The same, writing the updated values' 16-bit rounding to half_out[0..n) instead of the
  // half copy (ZeRO-Offload's upload ring).
  void run_grads_into(const void* grad, AdamElem format, int64_t begin, int64_t n,
                      uint16_t* half_out, Half16Kind out_kind) const;
  // run_grads with fp32 gradients.
  void run(const float* grad, int64_t begin, int64_t n) const {
    run_grads(grad, AdamElem::F32, begin, n);
  }
  void run_into(const float* grad, int64_t begin, int64_t n, uint16_t* half_out,
                Half16Kind out_kind) const {
    run_grads_into(grad, AdamElem::F32, begin, n, half_out, out_kind);
  }
  // The OpenMP team of every part's kernel.
  void set_num_threads(int n);
};

class FusedAdam : public torch::optim::Optimizer, public AdamMoments {
 public:
  FusedAdam(std::vector<torch::Tensor> params, const AdamHyper& hyper);
  torch::Tensor step(LossClosure closure = nullptr) override;
  bool adamw_mode() const { return adamw_mode_; }
  bool bias_correction() const { return bias_correction_; }

  // For the next step() only: gradients are multiplied by `scale` inside the kernel (1/loss_scale
  // times the clip coefficient), which spares a separate pass over the gradients.
  // `grads_are_scratch`: the caller does not read the gradients after the step, so on a GPU
  // libtorch's fused kernel may unscale them in place instead of in a copy of them.
  void set_grad_scale(float scale, bool grads_are_scratch = false) {
    grad_scale_ = scale;
    grads_are_scratch_ = grads_are_scratch;
  }
  // Low-precision masters (DeepSpeed's fp16/bf16_master_weights_and_grads): a parameter in
  // bf16 or fp16 is the master itself, updated in fp32 element by element and rounded back, its
  // moments in `dtype` (fp32, the default; bf16 with bf16.bf16_optimizer_states). Moments already
  // made keep their dtype. On the CPU the update widens in cache (cpu_adam.h
  // adam_step_buffers); on a GPU it runs on widened copies of the parameter's segment.
  void keep_moments_in(at::ScalarType dtype);
  at::ScalarType moment_dtype_for(const torch::Tensor& param) const;
  // Mixed precision: after every update of `param` its new value is also written into `target`
  // (bf16 or fp16, same numel, contiguous) in the same pass: the model's 16-bit copy of the master.
  void set_half_copy(const torch::Tensor& param, torch::Tensor target);
  // Whether step() reads gradients of dtype `grad` for `param` as they are, without a widened
  // fp32 copy: fp32 always; bf16 and fp16 on the CPU (widened in cache); bf16 and fp16 on a GPU
  // with this library's kernel (device_adam.h), or for a 16-bit master there (widened a chunk
  // at a time with it, device_adam_step_any_master).
  static bool reads_grads_of(const torch::Tensor& param, at::ScalarType grad);
  // The next step of `param` (a contiguous CPU tensor of this optimizer), to be run in
  // ranges: its state is created when missing and its step count advanced now, with the
  // group's current hyperparameters (with set_flat, each segment's group's) and the grad scale
  // set for this step (then reset to 1).
  AdamRangeStep prepare_step(const torch::Tensor& param);

  // Several parameter groups over one flat tensor (a ZeRO partition, zero/flat_groups.h): group 0
  // holds `master` alone, the other groups none, and step() (or prepare_step's ranges) updates
  // each segment [begin, begin + numel) of it with group `group`'s options. The state stays one
  // per master (the checkpoints read it there); the step count is shared. REQUIRES: a CPU or
  // device master this optimizer holds, segments within it, in order, covering it.
  struct Segment {
    int64_t begin = 0;
    int64_t numel = 0;
    size_t group = 0;
  };
  void set_flat(const torch::Tensor& master, std::vector<Segment> segments);

 private:
  torch::optim::AdamWParamState& state_of(const torch::Tensor& p);
  AdamStepParams hyper_for(const torch::optim::AdamWOptions& o, int64_t step) const;
  // set_flat's segments, each with its group's constants for step `step`.
  std::vector<AdamHyperRun> segment_runs(int64_t step);
  // The CPU update of `p` with state `s` (and its 16-bit copy, if any).
  AdamRangeStep range_step_of(const torch::Tensor& p, torch::optim::AdamWParamState& s,
                              const AdamStepParams& hp);

  bool adamw_mode_;
  bool bias_correction_;
  float grad_scale_ = 1.0f;
  bool grads_are_scratch_ = false;
  std::unordered_map<const void*, torch::Tensor> half_copies_;  // by param TensorImpl
  at::ScalarType moment_dtype_ = at::kFloat;  // keep_moments_in: for 16-bit parameters
  std::vector<Segment> segments_;  // set_flat: the master's elements by group
  void flat_step();
};

}  // namespace optim
}  // namespace deepspeed
