#include "device/pinned_memory.h"

#include <fmt/format.h>

#include <cstdlib>
#include <new>

#include <ATen/Context.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include "deepspeed/errors.h"

#ifdef DS_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include "device/cuda_init.h"
#endif

namespace deepspeed {
namespace device {
namespace {

constexpr size_t kPage = 4096;

#ifdef DS_WITH_CUDA
at::Tensor registered_buffer(int64_t numel, at::ScalarType dtype, c10::Device device) {
  init_cuda();  // else libtorch's is_pinned() (and its pinned-copy bookkeeping) does not see it
  c10::cuda::CUDAGuard guard(device);
  const size_t asked = static_cast<size_t>(numel) * c10::elementSize(dtype);
  const size_t bytes = std::max(kPage, (asked + kPage - 1) / kPage * kPage);
  void* data = nullptr;
  if (posix_memalign(&data, kPage, bytes) != 0) throw std::bad_alloc();
  const cudaError_t err = cudaHostRegister(data, bytes, cudaHostRegisterPortable);
  if (err != cudaSuccess) {
    std::free(data);
    cudaGetLastError();  // the error is reported here, not left for the next CUDA call
    throw Error(fmt::format(
        "pin_memory: the driver refused to page-lock {} bytes ({:.2f} GiB) of host memory for "
        "the offload ({}). Raise the locked-memory limit (ulimit -l), free host memory, or set "
        "pin_memory to false in zero_optimization.offload_optimizer / offload_param (slower "
        "copies, no overlap with backward)",
        bytes, bytes / 1073741824.0, cudaGetErrorString(err)));
  }
  return at::from_blob(
      data, {numel},
      [](void* p) {
        cudaHostUnregister(p);
        std::free(p);
      },
      at::TensorOptions().dtype(dtype));
}
#endif

}  // namespace

at::Tensor host_buffer(int64_t numel, at::ScalarType dtype, bool pin, c10::Device device) {
#ifdef DS_WITH_CUDA
  if (pin && device.is_cuda()) return registered_buffer(numel, dtype, device);
#else
  (void)pin;
  (void)device;
#endif
  return at::empty({numel}, at::TensorOptions().dtype(dtype));
}

}  // namespace device
}  // namespace deepspeed
