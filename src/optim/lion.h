// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms") with DeepSpeed's
// FusedLion / DeepSpeedCPULion semantics (`"optimizer": {"type": "Lion"}`), per tensor p with
// gradient g and momentum m (zeros at the first step):
//   c = β1·m + (1-β1)·g
//   p = p·(1 - lr·weight_decay) - lr·sign(c)        (decoupled decay)
//   m = β2·m + (1-β2)·g
// with the scalars (1-β, 1 - lr·wd) in fp32 arithmetic, as DeepSpeed's kernels. One difference,
// on purpose: sign(0) = 0 (the paper's), so a parameter whose gradient and momentum are exactly
// zero (an embedding row no batch has used yet) only decays. DeepSpeed never steps by 0, and its
// two kernels disagree there: FusedLion moves such a parameter by +lr (c > 0 ? -lr : lr),
// DeepSpeedCPULion by -lr for +0 (-copysign(lr, c)), every step.
// One state tensor (exp_avg, fp32 like the parameter it updates: 4 bytes per element where Adam
// keeps 8). Element-wise, so a ZeRO partition steps exactly as the whole tensor would.
//
// Where p, g and m are contiguous fp32 host tensors (stage 0 on the CPU, every ZeRO partition
// on the CPU, optimizer offload) the update is one pass over the three arrays, split over
// libtorch's intra-op threads (as DeepSpeedCPULion's vectorised loop); elsewhere (a GPU, another
// dtype or layout) it is the same arithmetic as tensor operations. The two agree bit for bit:
// both round each product and sum once in fp32, in the same order.
//
// Groups carry LionOptions (lr, betas, weight_decay): LR schedulers set lr, OneCycle's
// cycle_momentum sets betas (optim/lr_target.cpp). Checkpoints save its momentum per element as
// fragments ("lion_fragments", zero/moment_state.h), so a job resumes at any world size and
// ZeRO stage, as with Adam.
#pragma once
#include <tuple>
#include <vector>

#include <torch/optim/optimizer.h>
#include <torch/optim/serialize.h>

#include "deepspeed/config.h"

namespace deepspeed {
namespace optim {

// The "optimizer.params" of type Lion, DeepSpeed's names and defaults (FusedLion and
// DeepSpeedCPULion: lr 1e-3, betas (0.9, 0.999), weight_decay 0).
struct LionHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double weight_decay = 0.0;
};
// ConfigError naming optimizer.params.<key> for an unknown key or a value out of range.
LionHyper parse_lion_params(const OptimizerConfig& config);

struct LionOptions : public torch::optim::OptimizerCloneableOptions<LionOptions> {
  using betas_t = std::tuple<double, double>;
  explicit LionOptions(double lr = 1e-3) : lr_(lr) {}
  TORCH_ARG(double, lr) = 1e-3;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  TORCH_ARG(double, weight_decay) = 0;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
  friend bool operator==(const LionOptions& a, const LionOptions& b) {
    return a.lr() == b.lr() && a.betas() == b.betas() && a.weight_decay() == b.weight_decay();
  }
};

struct LionParamState : public torch::optim::OptimizerCloneableParamState<LionParamState> {
  TORCH_ARG(torch::Tensor, exp_avg);
  TORCH_ARG(int64_t, step) = 0;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  friend bool operator==(const LionParamState& a, const LionParamState& b) {
    return a.step() == b.step() && torch::equal(a.exp_avg(), b.exp_avg());
  }
};

LionOptions lion_options(const LionHyper& h);

class Lion : public torch::optim::Optimizer {
 public:
  Lion(std::vector<torch::optim::OptimizerParamGroup> groups, const LionOptions& defaults);
  Lion(std::vector<torch::Tensor> params, const LionHyper& hyper);
  torch::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  // For tests: step fp32 host tensors with the tensor operations too (what a GPU runs).
  void use_tensor_ops_on_host(bool on) { tensor_ops_on_host_ = on; }

 private:
  LionParamState& state_of(const torch::Tensor& p);
  bool tensor_ops_on_host_ = false;
};

}  // namespace optim
}  // namespace deepspeed
