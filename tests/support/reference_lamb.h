// A plain Lamb written from DeepSpeed's FusedLamb kernel (csrc/lamb/fused_lamb_cuda_kernel.cu),
// in fp64 with one tensor op per line, as the reference the project's optim::Lamb is checked
// against. A torch::optim::Optimizer, so tests can also pass it to initialize() as a client
// optimizer at stage 0 (where it steps the module's own parameters, one tensor per parameter).
#pragma once
#include <torch/torch.h>

namespace dstest {

struct RefLambOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool bias_correction = true, eps_inside_sqrt = false;
  double max_coeff = 10.0, min_coeff = 0.01;
};

class ReferenceLamb : public torch::optim::Optimizer {
 public:
  ReferenceLamb(std::vector<torch::Tensor> params, RefLambOptions o);
  torch::Tensor step(LossClosure closure = nullptr) override;
  std::vector<double> coeffs;  // the last step's trust ratios, per tensor

 private:
  RefLambOptions o_;
  int64_t t_ = 0;
  std::vector<torch::Tensor> m_, v_;  // fp64, per parameter
};

}  // namespace dstest
