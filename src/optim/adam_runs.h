// Adam's constants by run of elements: a flat buffer (a ZeRO partition) whose elements
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

// Element k of a buffer of `format`.
inline const void* element_at(const void* buffer, AdamElem format, int64_t k) {
  return static_cast<const char*>(buffer) + k * (format == AdamElem::F32 ? 4 : 2);
}

// adam_step_buffers over elements [begin, begin + n) of the buffer, each part with the
// hyper-parameters of the run that holds it. `b`, `grad` and copy16 (when not null) are at
// element `begin`. REQUIRES: `runs` in order, each element in [begin, begin + n) in one of them.
inline void adam_step_runs(const std::vector<AdamHyperRun>& runs, const AdamBuffers& b,
                           const void* grad, AdamElem grad_format, int64_t begin, int64_t n,
                           uint16_t* copy16 = nullptr, Half16Kind kind = Half16Kind::BF16) {
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
    adam_step_buffers(b.at(k), element_at(grad, grad_format, k), grad_format, len, run->hyper,
                      copy16 ? copy16 + k : nullptr, kind);
    at += len;
  }
}

}  // namespace deepspeed::optim
