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
  bool passed() override { return true; }
  void join_current() override {}
};

#ifdef DS_WITH_CUDA
class CudaFence : public CopyFence {
 public:
  explicit CudaFence(const c10::cuda::CUDAStream& stream) : device_(stream.device_index()) {
    event_.record(stream);
  }
  // On the event's device: the waiting thread (the offloaded update's worker) may never have
  // chosen one, and a CUDA call there would otherwise open a context on cuda:0.
  void wait() override {
    c10::cuda::CUDAGuard guard(device_);
    event_.synchronize();
  }
  bool passed() override {
    c10::cuda::CUDAGuard guard(device_);
    return event_.query();
  }
  void join_current() override { event_.block(c10::cuda::getCurrentCUDAStream(device_)); }

 private:
  c10::DeviceIndex device_;
  at::cuda::CUDAEvent event_;
};
#endif

}  // namespace

void HostFence::signal() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    signalled_ = true;
  }
  changed_.notify_all();
}

void HostFence::cancel() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cancelled_ = true;
  }
  changed_.notify_all();
}

void HostFence::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return signalled_ || cancelled_; });
  TORCH_CHECK(signalled_, "HostFence: the values this waited for were dropped (a failed "
              "backward)");
}

bool HostFence::passed() {
  std::lock_guard<std::mutex> lock(mutex_);
  return signalled_;
}

std::shared_ptr<CopyFence> CopyFence::record(c10::Device device) {
#ifdef DS_WITH_CUDA
  if (device.is_cuda())
    return std::make_shared<CudaFence>(c10::cuda::getCurrentCUDAStream(device.index()));
#endif
  return std::make_shared<PassedFence>();
}

// The side stream exists on a CUDA device of a CUDA build; everywhere else impl_ is null and
// every method runs its work inline, synchronously.
#ifdef DS_WITH_CUDA
struct SideStream::Impl {
  explicit Impl(c10::Device d)
      : device(d), stream(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, d.index())) {}
  c10::cuda::CUDAStream current() const { return c10::cuda::getCurrentCUDAStream(device.index()); }
  c10::Device device;
  c10::cuda::CUDAStream stream;
};

SideStream::SideStream(c10::Device device)
    : impl_(device.is_cuda() ? std::make_unique<Impl>(device) : nullptr) {}
#else
struct SideStream::Impl {};

SideStream::SideStream(c10::Device) {}
#endif

std::shared_ptr<CopyFence> SideStream::copy(at::Tensor dst, const at::Tensor& src) {
  std::shared_ptr<CopyFence> fence;
  run([&] {
    dst.copy_(src, /*non_blocking=*/impl_ != nullptr);
    fence = mark();
  });
  return fence;
}

void SideStream::join() { mark()->join_current(); }

void SideStream::follow_current() {
#ifdef DS_WITH_CUDA
  if (impl_) {
    at::cuda::CUDAEvent produced;
    produced.record(impl_->current());
    produced.block(impl_->stream);
  }
#endif
}

void SideStream::run(const std::function<void()>& work) {
#ifdef DS_WITH_CUDA
  if (impl_) {
    c10::cuda::CUDAStreamGuard guard(impl_->stream);
    return work();
  }
#endif
  work();
}

std::shared_ptr<CopyFence> SideStream::mark() {
#ifdef DS_WITH_CUDA
  if (impl_) return std::make_shared<CudaFence>(impl_->stream);
#endif
  return std::make_shared<PassedFence>();
}

void hold_until_current_stream(const at::Tensor& t) {
#ifdef DS_WITH_CUDA
  if (t.defined() && t.is_cuda()) t.record_stream(c10::cuda::getCurrentCUDAStream(t.device().index()));
#else
  (void)t;
#endif
}

void SideStream::used_on_current(const at::Tensor& t) {
  if (impl_) hold_until_current_stream(t);
}

void SideStream::reads(const at::Tensor& t) {
#ifdef DS_WITH_CUDA
  if (impl_ && t.defined() && t.is_cuda()) t.record_stream(impl_->stream);
#else
  (void)t;
#endif
}

SideStream::~SideStream() = default;

}  // namespace device
}  // namespace deepspeed
