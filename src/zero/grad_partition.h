// This rank's gradient partition: where a reducing stage puts each reduced bucket, and what the
// optimizer step (and the gradient norm) reads. Two homes:
//   DeviceGradPartition  a tensor on the compute device; a bucket is added into its place in
//                        stream order, so nothing has to be waited for (stages 0-3, and the
//                        all-reduce stages' view of their full gradient buffer)
//   HostGradPartition    ZeRO-Offload's partition in host memory, filled by downloads on a side
//                        stream (zero/host_grad_partition.h)
// The stages talk to this interface only, so neither knows which home it has; stage 3's swapped
// gradients (offload/grad_store.h) are unit slices in a file and stay a separate path.
#pragma once
#include <cstdint>
#include <memory>

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include "device/transfer_stream.h"

namespace deepspeed {
namespace zero {

class GradPartition {
 public:
  virtual ~GradPartition() = default;

  // The partition. Complete once wait() returned, or a range once its fence has passed.
  virtual const at::Tensor& tensor() const = 0;
  // Around every backward (every micro-step). `boundary`: it ends the accumulation.
  virtual void begin_micro_step(bool boundary) {}
  virtual void end_micro_step() {}
  // `reduced` (this micro-step's averaged gradients of elements [begin, begin + numel), produced
  // by work queued on the device's current stream) is added into the partition. The fence passes
  // once the result is readable from the host; null when readers in stream order need no fence,
  // or (a pageable host home) when only wait() makes the values readable.
  virtual std::shared_ptr<device::CopyFence> accumulate(int64_t begin,
                                                        const at::Tensor& reduced) = 0;
  // A fence after everything accumulated so far (null: nothing to wait for).
  virtual std::shared_ptr<device::CopyFence> written() { return nullptr; }
  // After a boundary's backward: the sum of squares of the partition's (final) values, fp64 [1]
  // on the compute device, a fresh tensor.
  virtual at::Tensor squared_norm() = 0;
  // For host readers of the whole partition (the step, tensor parallelism's norm split).
  virtual void wait() {}
  // The gradients are dropped (after a step, or a discarded one).
  virtual void clear() = 0;
  // Where the bytes count in a MemoryReport: host memory regardless of the compute device.
  virtual bool in_host_memory() const = 0;
  // The most compute-device memory its transfers have held at once beyond the partition (the
  // host home's bucket-sized temporaries on a GPU): counted with the communication buffers.
  virtual int64_t device_temporary_bytes() const { return 0; }
  // The same in host memory (a pageable host home's page-locked bucket copies).
  virtual int64_t host_temporary_bytes() const { return 0; }
  // The partition's size, held or not (a released device partition is allocated again at the
  // next backward: the bytes count as the step's).
  virtual int64_t bytes() const;
};

class DeviceGradPartition final : public GradPartition {
 public:
  // Owns `numel` zeros of `dtype` on `device`. `release` (zero_optimization.release_gradients):
  // clear() frees them instead of zeroing, and the next use allocates them again, so between a
  // step and the next backward's first gradient the partition holds no memory (nor before the
  // first backward).
  DeviceGradPartition(int64_t numel, at::ScalarType dtype, c10::Device device,
                      bool release = false);
  // Adopts `buffer` (a view of a larger gradient buffer: the all-reduce stages). Never released.
  explicit DeviceGradPartition(at::Tensor buffer);

  // Allocates a released partition (zeros) first.
  const at::Tensor& tensor() const override;
  // For a writer that writes every element before anything reads it (SingleRankGradients'
  // first micro-step after a step): a released partition comes back uninitialized, sparing the
  // zeroing pass; a held one as it is.
  const at::Tensor& acquire_uninitialized();
  bool holds_memory() const { return tensor_.defined(); }
  // A releasing partition's memory is freed (values kept otherwise: the caller writes them all
  // again before reading).
  void release();
  std::shared_ptr<device::CopyFence> accumulate(int64_t begin, const at::Tensor& reduced) override;
  at::Tensor squared_norm() override;
  void clear() override;
  bool in_host_memory() const override { return false; }
  int64_t bytes() const override;

 private:
  void allocate(bool zeroed) const;
  mutable at::Tensor tensor_;  // undefined while released
  int64_t numel_;
  at::ScalarType dtype_;
  c10::Device device_;
  bool release_ = false;
  bool adopted_ = false;
};

// Host memory (page-locked with `pin`; on a GPU without it, pageable and filled through
// page-locked copies) when the update reads the gradients there
// (ShardOptimizer::gradients_in_host_memory), else the compute device.
// `release`: a device partition is freed after each step (DeviceGradPartition); a host partition
// is kept (it is what the offloaded update reads, and page-locked memory is slow to allocate).
std::unique_ptr<GradPartition> make_grad_partition(int64_t numel, at::ScalarType dtype,
                                                   c10::Device device, bool in_host_memory,
                                                   bool pin, bool release = false);

}  // namespace zero
}  // namespace deepspeed
