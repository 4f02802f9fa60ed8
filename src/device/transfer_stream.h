// Host<->device copies that overlap compute, for ZeRO-Offload's step during backward
// (zero/step_during_backward.h). On a GPU: a fence is an event on the device's current stream
// that a host thread can wait for, and a SideStream is a pooled CUDA stream for uploads that the
// compute stream joins later (an event, not a device-wide sync). On the CPU, or a build without
// CUDA, copies are synchronous and fences are already passed: the same code runs and is tested
// on the CPU.
#pragma once
#include <memory>

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

namespace deepspeed {
namespace device {

// A point in `device`'s current stream, recorded now. wait() blocks the calling thread (any
// thread) until the work issued before it has finished.
class CopyFence {
 public:
  static std::shared_ptr<CopyFence> record(c10::Device device);
  virtual ~CopyFence() = default;
  virtual void wait() = 0;
};

// Copies issued here run in order on one side stream of `device`; join() makes the device's
// current stream wait for all of them. copy() may be called from any thread, but from one at a
// time. REQUIRES: what a copy overwrites is no longer read by work still queued on the compute
// stream (the caller waited for a fence recorded after that work).
class SideStream {
 public:
  explicit SideStream(c10::Device device);
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
  // dst.copy_(src), asynchronous when src is pinned host memory and dst is on the GPU. The
  // fence is passed when the copy is done (src may be reused).
  std::shared_ptr<CopyFence> copy(at::Tensor dst, const at::Tensor& src);
  void join();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace device
}  // namespace deepspeed
