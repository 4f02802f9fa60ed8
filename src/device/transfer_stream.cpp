#include "device/transfer_stream.h"

#ifdef DS_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace deepspeed {
namespace device {
namespace {

class PassedFence : public CopyFence {
 public:
  void wait() override {}
};

#ifdef DS_WITH_CUDA
class CudaFence : public CopyFence {
 public:
  explicit CudaFence(const c10::cuda::CUDAStream& stream) { event_.record(stream); }
  void wait() override { event_.synchronize(); }

 private:
  at::cuda::CUDAEvent event_;
};
#endif

}  // namespace

std::shared_ptr<CopyFence> CopyFence::record(c10::Device device) {
#ifdef DS_WITH_CUDA
  if (device.is_cuda())
    return std::make_shared<CudaFence>(c10::cuda::getCurrentCUDAStream(device.index()));
#endif
  return std::make_shared<PassedFence>();
}

#ifdef DS_WITH_CUDA
struct SideStream::Impl {
  explicit Impl(c10::Device d)
      : device(d), stream(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, d.index())) {}
  c10::Device device;
  c10::cuda::CUDAStream stream;
};

SideStream::SideStream(c10::Device device)
    : impl_(device.is_cuda() ? std::make_unique<Impl>(device) : nullptr) {}

std::shared_ptr<CopyFence> SideStream::copy(at::Tensor dst, const at::Tensor& src) {
  if (!impl_) {
    dst.copy_(src);
    return std::make_shared<PassedFence>();
  }
  c10::cuda::CUDAStreamGuard guard(impl_->stream);
  dst.copy_(src, /*non_blocking=*/true);
  return std::make_shared<CudaFence>(impl_->stream);
}

void SideStream::join() {
  if (!impl_) return;
  at::cuda::CUDAEvent done;
  done.record(impl_->stream);
  done.block(c10::cuda::getCurrentCUDAStream(impl_->device.index()));
}
#else
struct SideStream::Impl {};

SideStream::SideStream(c10::Device) {}

std::shared_ptr<CopyFence> SideStream::copy(at::Tensor dst, const at::Tensor& src) {
  dst.copy_(src);
  return std::make_shared<PassedFence>();
}

void SideStream::join() {}
#endif

SideStream::~SideStream() = default;

}  // namespace device
}  // namespace deepspeed
