// glibc malloc set to keep freed memory for reuse, once per process, when an entry point starts
// (deepspeed.initialize, initialize_pipeline, zero::Init, init_inference, init_distributed).
//
// Why: libtorch's CPU allocator is plain malloc. glibc serves blocks above its mmap threshold
// (128 KiB, raised as such blocks are freed, never above 32 MiB) with mmap and gives them back at
// free, and trims the heap top above its trim threshold: a training step that allocates and frees
// the same activations, gradients and ZeRO-3 gathered units every step then takes a page fault per
// 4 KiB of them every step. On the 2-core VM these figures come from a fault costs microseconds
// (paravirtualized): 20% of a ZeRO-3 step's samples were page faults, and with the settings below
// ZeRO-3 ran 1.4-2.1x, ZeRO-1 fp32 1.3-1.4x and the demo (ZeRO-2 fp32) 1.4x shorter steps
// (docs/benchmarks.md, "Host allocator"). The CUDA caching allocator keeps device memory for the
// same reason; PyTorch's CPU users preload jemalloc or tcmalloc. Blocks over 32 MiB are still
// mapped: stage 3 keeps its large unit buffers itself (zero/stage3/spare_buffers.h).
//
// The settings: M_MMAP_THRESHOLD 32 MiB (glibc's maximum: larger blocks are still mapped and given
// back at once) and M_TRIM_THRESHOLD 1 GiB (the heap keeps up to that much freed memory at its
// top). The cost: resident memory stays at the peak of what was freed: 5-10% more peak RSS at
// 19M parameters, 15-19% at 52M. Left alone (with the reason) when DS_MALLOC_TUNING is 0/false, when the user chose glibc's
// malloc settings (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_,
// MALLOC_MMAP_MAX_, or glibc.malloc tunables in GLIBC_TUNABLES: the benchmarks' memory runs set
// MALLOC_MMAP_THRESHOLD_=65536 so that peak RSS shows what was needed), when LD_PRELOAD names
// another allocator (a *malloc* library: jemalloc, tcmalloc, mimalloc), and without glibc.
#pragma once
#include <cstddef>
#include <functional>
#include <string>

namespace deepspeed {
namespace util {

struct HostAllocatorTuning {
  bool apply = false;  // decide's answer; after apply_host_allocator_tuning: whether it was set
  std::string reason;  // why not, when !apply; what was set, when applied
  size_t mmap_threshold = size_t{32} << 20;
  size_t trim_threshold = size_t{1} << 30;
};

// The decision for an environment read through `getenv` (std::getenv in the process). Throws
// ConfigError naming DS_MALLOC_TUNING for a value other than 1/true/0/false.
HostAllocatorTuning decide_host_allocator_tuning(
    const std::function<const char*(const char*)>& getenv);

// Sets glibc's thresholds as `t` says (nothing unless t.apply). False, with t.reason saying so,
// when glibc refused a value.
bool apply_host_allocator_tuning(HostAllocatorTuning& t);

// Decides from the process environment and applies, the first time only; later calls return the
// first outcome. Thread-safe.
const HostAllocatorTuning& tune_host_allocator();

// Whether tune_host_allocator has set the thresholds in this process (without deciding anything:
// false before its first call). For messages: an out-of-host-memory report names
// DS_MALLOC_TUNING=0 then (device/out_of_memory.h).
bool host_allocator_tuned();

}  // namespace util
}  // namespace deepspeed
