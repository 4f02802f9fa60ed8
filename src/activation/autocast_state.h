// The autocast settings a checkpointed segment's first run saw, so that its recomputation in
// backward (usually outside the autocast region) computes in the same precision as the first run
// and the gradients are those of a plain backward (torch.utils.checkpoint does the same).
#pragma once
#include <c10/core/ScalarType.h>

namespace deepspeed {
namespace checkpointing {

struct AutocastState {
  // The calling thread's autocast switches (thread-local in libtorch): enabled and lower-precision
  // dtype for the CPU and for CUDA, and whether casts of parameters are cached.
  static AutocastState capture();

  bool cpu_enabled = false;
  at::ScalarType cpu_dtype = at::kBFloat16;
  bool cuda_enabled = false;
  at::ScalarType cuda_dtype = at::kHalf;
  bool cache_enabled = true;
};

// Enters `saved` for the scope as torch.autocast's __enter__ does (switches set, nesting counted)
// and leaves as its __exit__ does: the cast cache cleared when the outermost autocast region ends,
// the switches found on entry put back.
class AutocastScope {
 public:
  explicit AutocastScope(const AutocastState& saved);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  AutocastState entry_;
};

}  // namespace checkpointing
}  // namespace deepspeed
