// What differs between libtorch 1.13 (Debian's, CPU) and 2.x (the PyTorch wheel and archive, CPU
// or CUDA), kept in one place so the rest of the tree is written once.
#pragma once
#include <cstring>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#include <ATen/Tensor.h>
#include <c10/core/Allocator.h>
#include <torch/optim/optimizer.h>
#include <torch/version.h>

// c10::Allocator: libtorch 2.3 made allocate() non-const and added a pure virtual copy_data().
// An allocator written once declares `c10::DataPtr allocate(size_t n) DS_ALLOCATE_CONST override`
// and derives from compat::HostAllocator for copy_data.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define DS_ALLOCATE_CONST
#else
#define DS_ALLOCATE_CONST const
#endif

namespace deepspeed {
namespace compat {

// The base of the CPU allocators this tree installs: libtorch >= 2.3 clones a storage through
// the allocator that made it (copy_data, pure virtual there; no such virtual in 1.13, hence no
// `override`), and for host memory that is a memcpy.
class HostAllocator : public c10::Allocator {
 public:
  void copy_data(void* dest, const void* src, std::size_t count) const {
    std::memcpy(dest, src, count);
  }
};

// torch::optim::Optimizer::state() is keyed by the parameter's TensorImpl address: printed as a
// string in 1.13 (c10::guts::to_string, which streams the pointer), the pointer itself (void*)
// in 2.x. The key must be exactly libtorch's, since its own optimizers look their state up by it.
using OptimizerStateKey = typename std::decay_t<
    decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

// (A template, so that the branch for the other libtorch is discarded, not compiled.)
template <class Key = OptimizerStateKey>
Key optimizer_state_key(const at::Tensor& param) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;
    key << static_cast<const void*>(param.unsafeGetTensorImpl());
    return key.str();
  } else {
    return param.unsafeGetTensorImpl();
  }
}

// libtorch 2.x has the fused multi-tensor Adam(W) kernels (at::_fused_adam_/_fused_adamw_, CUDA
// and CPU) and scaled_dot_product_attention; 1.13 has neither.
constexpr bool kHasFusedAdamOp = TORCH_VERSION_MAJOR >= 2;

}  // namespace compat
}  // namespace deepspeed
