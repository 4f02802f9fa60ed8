// Lamb with DeepSpeed's FusedLamb semantics (csrc/lamb/fused_lamb_cuda_kernel.cu), per tensor p
// with gradient g (times the engine's grad scale), moments m, v and step t:
//   m = β1·m + (1-β1)·g;   v = β2·v + (1-β2)·g²
//   u = m / (sqrt(v) + eps) + weight_decay·p        (eps_inside_sqrt: m / sqrt(v + eps))
//   ratio = clamp(‖p‖ / ‖u‖, min_coeff, max_coeff), or 1 when either norm is 0
//   step_size = lr·sqrt(1-β2^t)/(1-β1^t)            (lr without bias_correction)
//   p -= step_size · ratio · u
// Note FusedLamb's bias correction scales the step only; u and the ratio use the raw moments.
//
// ZeRO stages 1-2 hand the optimizer one tensor, this rank's partition of the flat buffer, which
// holds *fragments* of parameters (a parameter may straddle partitions). set_fragments() tells
// Lamb where each parameter's fragment lies; the trust ratio then uses whole-parameter norms:
// each rank sums ‖p‖² and ‖u‖² over its fragments of parameter i into a [2 × num_params] fp64
// tensor, and one all-reduce over the data-parallel group (NormSum) makes every rank hold the
// global sums, so every fragment of a parameter is scaled by the same ratio. Elements of the
// partition in no fragment (alignment padding) are not updated.
//
// Groups carry torch::optim::AdamWOptions (lr, betas, eps, weight_decay) so LR schedulers work
// as with Adam; state is AdamWParamState, so checkpoints handle it as Adam's (adam_moments.h).
// Not thread-safe. step() is COLLECTIVE when fragments with a NormSum are set.
#pragma once
#include <functional>
#include <unordered_map>
#include <vector>

#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>

#include "optim/adam_moments.h"
#include "optim/optimizer_params.h"

namespace deepspeed {
namespace optim {

class Lamb : public torch::optim::Optimizer, public AdamMoments {
 public:
  struct Fragment {
    int64_t param = 0;  // which parameter (0 .. num_params-1)
    int64_t begin = 0;  // first element in the optimizer's tensor
    int64_t numel = 0;
  };
  // Sums a [2 × num_params] fp64 tensor over the ranks that share the parameters, in place.
  using NormSum = std::function<void(at::Tensor&)>;

  Lamb(std::vector<torch::Tensor> params, const LambHyper& hyper);
  torch::Tensor step(LossClosure closure = nullptr) override;

  // REQUIRES: the optimizer holds exactly one tensor; fragments lie inside it and do not
  // overlap; every rank of the group passes the same num_params.
  void set_fragments(std::vector<Fragment> fragments, int64_t num_params, NormSum sum);
  // For the next step() only: gradients are multiplied by `scale`.
  void set_grad_scale(float scale) { grad_scale_ = scale; }
  // The trust ratios of the last step (DeepSpeed's get_lamb_coeffs()): one per tensor, or one
  // per parameter with fragments.
  const std::vector<double>& lamb_coeffs() const { return coeffs_; }
  const LambHyper& hyper() const { return hyper_; }

 protected:
  std::vector<double> coeffs_;  // lamb_coeffs(); 1-bit Lamb writes its frozen-phase ones

 private:
  torch::optim::AdamWParamState& state_of(const torch::Tensor& p);
  // m, v updated; returns u (same shape as p).
  torch::Tensor moments_and_update(const torch::Tensor& p, const torch::Tensor& grad,
                                   torch::optim::AdamWParamState& s,
                                   const torch::optim::AdamWOptions& o);
  double step_size(const torch::optim::AdamWOptions& o, int64_t step) const;
  double clamp_ratio(double w_norm, double u_norm) const;
  void fragmented_step(torch::Tensor& p, const torch::optim::AdamWOptions& o);

  LambHyper hyper_;
  float grad_scale_ = 1.0f;
  std::vector<Fragment> fragments_;
  int64_t num_params_ = 0;
  NormSum sum_;
};

}  // namespace optim
}  // namespace deepspeed
