// Swapping c10's process-wide CPU allocator and putting it back (inference::DeferredInit's
// placeholder allocator is installed this way; tests layer a counting allocator the same way).
#pragma once
#include <c10/core/Allocator.h>

#include <cstdint>

namespace deepspeed {
namespace tp {

// c10 keeps one CPU allocator per process with a priority: SetCPUAllocator(a, p) is ignored when
// p is below the installed one's. install_cpu_allocator sets `a` at the lowest priority that
// takes, which is the installed one's, so that restore_cpu_allocator can put `previous` back at
// that same priority (a higher one would lock out whoever sets an allocator later).
struct AllocatorSwap {
  at::Allocator* previous = nullptr;
  uint8_t priority = 0;
};
AllocatorSwap install_cpu_allocator(at::Allocator* a);
// Puts swap.previous back if `installed` is still the CPU allocator (someone who installed one
// on top of it keeps theirs; `installed` must then stay valid: allocators live forever).
void restore_cpu_allocator(at::Allocator* installed, const AllocatorSwap& swap);

}  // namespace tp
}  // namespace deepspeed
