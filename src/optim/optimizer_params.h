// Hyper-parameters of Lamb and the 1-bit family, read from the "optimizer" block with DeepSpeed's
// names and defaults (docs/config.md; the reference is DeepSpeed's FusedLamb and OnebitAdam
// constructors). Unknown keys are ConfigErrors naming optimizer.params.<key>, as for Adam.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "deepspeed/config.h"

namespace deepspeed {
namespace optim {

// DeepSpeed's FusedLamb (deepspeed/ops/lamb): Adam-style moments, per-tensor trust ratio.
struct LambHyper {
  double lr = 1e-3;              // params.lr
  double beta1 = 0.9;            // params.betas[0]
  double beta2 = 0.999;          // params.betas[1]
  double eps = 1e-8;             // params.eps
  double weight_decay = 0.0;     // params.weight_decay (added to the update, then trust-scaled)
  bool bias_correction = true;   // params.bias_correction: step size lr·sqrt(1-β2^t)/(1-β1^t)
  bool eps_inside_sqrt = false;  // params.eps_inside_sqrt: sqrt(v + eps) instead of sqrt(v) + eps
  double max_coeff = 10.0;       // params.max_coeff: upper clamp of the trust ratio
  double min_coeff = 0.01;       // params.min_coeff: lower clamp of the trust ratio
};

// DeepSpeed's OnebitAdam (deepspeed/runtime/fp16/onebit/adam.py).
struct OneBitAdamHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  int64_t freeze_step = 100000;  // params.freeze_step: exact-Adam warm-up steps
  bool cuda_aware = false;       // params.cuda_aware: MPI detail; accepted, no effect here
  std::string comm_backend_name = "nccl";  // "nccl", "mpi", "compressed": all map to the
                                           // build's communicator (Gloo here), with a note
};

// ZeroOneAdam (deepspeed/runtime/fp16/onebit/zoadam.py).
struct ZeroOneAdamHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  int64_t var_freeze_step = 100000;    // params.var_freeze_step: variance updates stop here
  int64_t var_update_scaler = 16;      // params.var_update_scaler: variance-update interval growth
  int64_t local_step_scaler = 32678;   // params.local_step_scaler: local-step interval growth
  int64_t local_step_clipper = 16;     // params.local_step_clipper: most local steps in a row
  bool cuda_aware = false;
  std::string comm_backend_name = "nccl";
};

// DeepSpeed's OnebitLamb (deepspeed/runtime/fp16/onebit/lamb.py).
struct OneBitLambHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double max_coeff = 10.0;         // params.max_coeff: trust-ratio clamp during the warm-up
  double min_coeff = 0.01;         // params.min_coeff
  int64_t freeze_step = 100000;    // params.freeze_step: exact-Lamb warm-up steps
  double coeff_beta = 0.9;         // params.coeff_beta: running average of the warm-up ratios
  double factor_max = 4.0;         // params.factor_max: bounds of the frozen-phase factor
  double factor_min = 0.5;         // params.factor_min
  double factor_threshold = 0.1;   // params.factor_threshold: most relative change per step
  bool cuda_aware = false;
  std::string comm_backend_name = "nccl";
};

// Throw ConfigError for a bad or unknown parameter; `warnings` (may be null) receives notes.
LambHyper parse_lamb_params(const OptimizerConfig& config);
OneBitAdamHyper parse_onebit_adam_params(const OptimizerConfig& config,
                                         std::vector<std::string>* warnings = nullptr);
ZeroOneAdamHyper parse_zero_one_adam_params(const OptimizerConfig& config,
                                            std::vector<std::string>* warnings = nullptr);
OneBitLambHyper parse_onebit_lamb_params(const OptimizerConfig& config,
                                         std::vector<std::string>* warnings = nullptr);

}  // namespace optim
}  // namespace deepspeed
