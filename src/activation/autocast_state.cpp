#include "activation/autocast_state.h"

#include <ATen/autocast_mode.h>

#include "util/torch_compat.h"

namespace deepspeed {
namespace checkpointing {
namespace {

void apply(const AutocastState& s) {
  compat::set_autocast_enabled(c10::kCPU, s.cpu_enabled);
  compat::set_autocast_dtype(c10::kCPU, s.cpu_dtype);
  compat::set_autocast_enabled(c10::kCUDA, s.cuda_enabled);
  compat::set_autocast_dtype(c10::kCUDA, s.cuda_dtype);
  at::autocast::set_autocast_cache_enabled(s.cache_enabled);
}

}  // namespace

AutocastState AutocastState::capture() {
  AutocastState s;
  s.cpu_enabled = compat::autocast_enabled(c10::kCPU);
  s.cpu_dtype = compat::autocast_dtype(c10::kCPU);
  s.cuda_enabled = compat::autocast_enabled(c10::kCUDA);
  s.cuda_dtype = compat::autocast_dtype(c10::kCUDA);
  s.cache_enabled = at::autocast::is_autocast_cache_enabled();
  return s;
}

AutocastScope::AutocastScope(const AutocastState& saved) : entry_(AutocastState::capture()) {
  apply(saved);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  // The casts cached inside belong to this region (their graphs are the recomputation's).
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  apply(entry_);
}

}  // namespace checkpointing
}  // namespace deepspeed
