// Adam's constants by run of elements: a flat fp32 buffer (a ZeRO partition) whose elements
// belong to several parameter groups (zero/flat_groups.h) is updated with each group's lr,
// betas, eps and weight decay on that group's runs. A caller that updates the buffer piece by
// piece (ZeRO-Offload's ranges, the NVMe swap's sub-groups) cuts each piece at the runs'
// boundaries here: one lookup per piece, never one per element.
#pragma once
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "optim/cpu_adam.h"

namespace deepspeed::optim {

// Elements [begin, begin + numel) of the buffer step with `hyper`.
struct AdamHyperRun {
  int64_t begin = 0;
  int64_t numel = 0;
  AdamStepParams hyper;
};

// The kernel for fp32 gradients, or for bf16 ones given as their bits (cpu_adam.h).
inline void adam_kernel(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                        int64_t n, const AdamStepParams& p, uint16_t* param16, Half16Kind kind) {
  adam_step(param, grad, exp_avg, exp_avg_sq, n, p, param16, kind);
}
inline void adam_kernel(float* param, const uint16_t* grad_bf16, float* exp_avg,
                        float* exp_avg_sq, int64_t n, const AdamStepParams& p, uint16_t* param16,
                        Half16Kind kind) {
  adam_step_bf16_grad(param, grad_bf16, exp_avg, exp_avg_sq, n, p, param16, kind);
}

// adam_step over elements [begin, begin + n) of the buffer, each part with the hyper-parameters
// of the run that holds it. The pointers are at element `begin` (grad[0] is element begin's
// gradient, param16 too when not null). Grad: fp32, or bf16 bits. REQUIRES: `runs` in order,
// each element in [begin, begin + n) in one of them.
template <typename Grad>
void adam_step_runs(const std::vector<AdamHyperRun>& runs, float* param, const Grad* grad,
                    float* exp_avg, float* exp_avg_sq, int64_t begin, int64_t n,
                    uint16_t* param16 = nullptr, Half16Kind kind = Half16Kind::BF16) {
  // The last run beginning at or before `begin` holds it.
  auto run = std::upper_bound(runs.begin(), runs.end(), begin,
                              [](int64_t at, const AdamHyperRun& r) { return at < r.begin; });
  if (run != runs.begin()) --run;
  for (int64_t at = begin, end = begin + n; at < end; ++run) {
    if (run != runs.end() && run->numel == 0) continue;
    // Past the runs, or before the first: a caller's bug, not a silent step with other options.
    if (run == runs.end() || run->begin > at || at >= run->begin + run->numel)
      throw std::logic_error("adam_step_runs: element " + std::to_string(at) +
                             " is in no run of hyper-parameters");
    const int64_t k = at - begin, len = std::min(end, run->begin + run->numel) - at;
    adam_kernel(param + k, grad + k, exp_avg + k, exp_avg_sq + k, len, run->hyper,
                param16 ? param16 + k : nullptr, kind);
    at += len;
  }
}

}  // namespace deepspeed::optim
