// What differs between libtorch 1.13 (Debian's, CPU) and 2.x (the PyTorch wheel and archive, CPU
// or CUDA), kept in one place so the rest of the tree is written once.
#pragma once
#include <cstring>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#include <ATen/Tensor.h>
#include <ATen/autocast_mode.h>
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

// Autocast's per-device switches. libtorch >= 2.4 takes the device type (at::autocast::
// is_autocast_enabled(kCPU), get_autocast_dtype(kCPU), ...; the older names are deprecated there);
// 1.13 (to 2.3) has one function per device: is_cpu_enabled / get_autocast_cpu_dtype for the CPU
// and is_enabled / get_autocast_gpu_dtype for CUDA. Only the CPU and CUDA are asked for here.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
inline bool autocast_enabled(c10::DeviceType d) { return at::autocast::is_autocast_enabled(d); }
inline void set_autocast_enabled(c10::DeviceType d, bool on) {
  at::autocast::set_autocast_enabled(d, on);
}
inline at::ScalarType autocast_dtype(c10::DeviceType d) {
  return at::autocast::get_autocast_dtype(d);
}
inline void set_autocast_dtype(c10::DeviceType d, at::ScalarType t) {
  at::autocast::set_autocast_dtype(d, t);
}
#else
inline bool autocast_enabled(c10::DeviceType d) {
  return d == c10::kCPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
}
inline void set_autocast_enabled(c10::DeviceType d, bool on) {
  if (d == c10::kCPU) at::autocast::set_cpu_enabled(on);
  else at::autocast::set_enabled(on);
}
inline at::ScalarType autocast_dtype(c10::DeviceType d) {
  return d == c10::kCPU ? at::autocast::get_autocast_cpu_dtype()
                        : at::autocast::get_autocast_gpu_dtype();
}
inline void set_autocast_dtype(c10::DeviceType d, at::ScalarType t) {
  if (d == c10::kCPU) at::autocast::set_autocast_cpu_dtype(t);
  else at::autocast::set_autocast_gpu_dtype(t);
}
#endif

}  // namespace compat
}  // namespace deepspeed
