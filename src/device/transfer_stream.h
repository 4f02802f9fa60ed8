// Host<->device copies that overlap compute: ZeRO-Offload's step during backward
// (zero/step_during_backward.h) and ZeRO-Infinity's unit fetches (zero/stage3/unit_gatherer.h).
// On a GPU: a fence is an event on the device's current stream
// that a host thread can wait for, and a SideStream is a pooled CUDA stream for uploads that the
// compute stream joins later (an event, not a device-wide sync). On the CPU, or a build without
// CUDA, copies are synchronous and fences are already passed: the same code runs and is tested
// on the CPU.
#pragma once
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>

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
  // Whether the work issued before it has finished, without waiting.
  virtual bool passed() = 0;
  // The device's current stream waits for this point (an event, the host goes on).
  virtual void join_current() = 0;
  // Nobody will complete what this fence waits for (a failed backward dropped it): waiters are
  // woken and throw. A fence that completes by itself (a device's event) ignores it.
  virtual void cancel() {}
};

// A fence that a host thread passes by hand: for values that the engine's thread puts into host
// memory itself (a pageable gradient partition, zero/host_grad_partition.h) while another thread
// (the update during backward) waits for them. Thread-safe. The device has nothing to wait for.
//
// Whoever passes it must not wait on it: on a GPU that is two threads in turn (autograd's device
// thread puts copies in during backward, the user's thread after it), so no owner can be checked.
class HostFence : public CopyFence {
 public:
  void signal();  // the values are there
  void cancel() override;
  void wait() override;  // throws c10::Error once cancelled (unless signalled first)
  bool passed() override;
  void join_current() override {}

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool signalled_ = false;
  bool cancelled_ = false;
};

// A GPU tensor that the device's current stream has work queued on (reading or writing it) but
// that was allocated on another stream (a side stream's fetch, a collective's output): its
// memory goes back to its pool only after that work is done (the caching allocator's
// record_stream), so the allocating stream cannot reuse it under a kernel still running. A CPU
// tensor needs nothing.
void hold_until_current_stream(const at::Tensor& t);

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
  // Work issued on the side stream from now on starts only after what the device's current
  // stream has issued so far (an event, the host goes on): a download of values the compute
  // stream is still producing.
  void follow_current();
  // Runs `work` with the side stream current, so what it launches (copies, kernels, collectives:
  // ProcessGroupNCCL orders its stream after the current one) queues behind the side stream's
  // earlier work only, not behind the compute stream's. Tensors it allocates belong to the side
  // stream's memory pool (see used_on_current).
  void run(const std::function<void()>& work);
  // A fence after everything issued on the side stream so far.
  std::shared_ptr<CopyFence> mark();
  // `t` was allocated inside run() and is now read or written by the compute stream: its memory
  // goes back to the pool only after the compute stream's work queued before the free is done
  // (the caching allocator's record_stream; otherwise a later side-stream allocation could
  // reuse it under a kernel still running).
  void used_on_current(const at::Tensor& t);
  // The other way round: `t` belongs to the compute stream and work issued here reads it; its
  // memory is reused only after that work is done (record_stream on the side stream).
  void reads(const at::Tensor& t);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace device
}  // namespace deepspeed
