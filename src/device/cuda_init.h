// CUDA's lazy initialisation, made explicit: libtorch 2.x initialises CUDA with a program's first
// CUDA tensor, and until then its caching allocator refuses statistics and memory fractions ("did
// you call init?") and Tensor::is_pinned() answers false for page-locked memory. Code that may run
// before any CUDA tensor exists (a memory cap, the offload's pinned buffers) calls this first.
#pragma once
#ifdef DS_WITH_CUDA
#include <ATen/Context.h>
#include <torch/version.h>

namespace deepspeed {
namespace device {

inline void init_cuda() {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 6)
  at::globalContext().lazyInitDevice(c10::kCUDA);
#else
  at::globalContext().lazyInitCUDA();
#endif
}

}  // namespace device
}  // namespace deepspeed
#endif
