// ZeRO-Offload's gradient partition in host memory. With offload_optimizer "cpu" and FusedAdam the
// update reads the averaged gradients on the host (zero/step_during_backward.h); keeping a copy of
// the partition on the GPU as well would cost 2Ψ/N bytes there that DeepSpeed does not spend (its
// offloaded stages keep only the reduction buckets on the GPU: the ZeRO-Offload paper's "2Ψ of
// 16-bit parameters"). So the reducing stages (2 and 3) hand each reduced bucket here instead of
// adding it into a device partition:
//   - the first micro-step after clear() copies the bucket's part down into its place: every
//     element of the partition is written once per micro-step (the buckets tile it), so a step
//     never has to zero the host partition;
//   - a later micro-step of the same accumulation adds. On a GPU the host slice goes up into a
//     bucket-sized temporary, the bucket is added there and the sum comes back down (DeepSpeed's
//     async_accumulate_grad_in_cpu_via_gpu), so the host thread does no arithmetic and the order
//     of the copies is the stream's;
//   - at an accumulation boundary the final values' sum of squares goes into a device
//     accumulator: the gradient norm (clipping, fp16's overflow vote) needs no pass over host
//     memory.
// The work runs on a download stream that first waits (an event) for the compute stream, which
// produced the bucket; accumulate() returns a fence after which the host values are there, and
// the offloaded update waits for that fence on its own thread. On the CPU the same code runs
// synchronously (a SideStream on the CPU is inline), which is how the CPU suite tests it.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include "device/transfer_stream.h"
#include "util/ranges.h"
#include "zero/grad_partition.h"

namespace deepspeed {
namespace zero {

class HostGradPartition final : public GradPartition {
 public:
  // `numel` elements of `dtype` in host memory, page-locked for copies with `device` when `pin`
  // (offload_optimizer.pin_memory).
  HostGradPartition(int64_t numel, at::ScalarType dtype, c10::Device device, bool pin);
  ~HostGradPartition() override;  // waits for copies still writing the buffer

  const at::Tensor& tensor() const override { return host_; }
  // A boundary restarts the sum of squares.
  void begin_micro_step(bool boundary) override;
  void end_micro_step() override { in_micro_step_ = false; }
  // The fence passes once the host holds the result.
  std::shared_ptr<device::CopyFence> accumulate(int64_t begin, const at::Tensor& reduced) override;
  std::shared_ptr<device::CopyFence> written() override { return downloads_.mark(); }
  // The boundary's sum of squared final values, accumulated on the device as the buckets came
  // down: ready for the compute stream (no host wait, no pass over host memory).
  at::Tensor squared_norm() override;
  // Waits for every copy issued so far.
  void wait() override;
  // The next micro-step writes instead of adding: no zeroing pass over host memory.
  void clear() override;
  bool in_host_memory() const override { return true; }
  int64_t device_temporary_bytes() const override { return peak_temporary_bytes_; }

 private:
  void note_temporary(const at::Tensor& t);
  at::Tensor host_;
  at::Tensor squares_;  // fp64 [1] on the device, written on the download stream only
  c10::Device device_;
  device::SideStream downloads_;
  bool cleared_ = true;         // nothing accumulated since clear() (or ever)
  bool overwrite_ = false;      // this micro-step writes: its first since clear()
  bool boundary_ = false;       // this micro-step ends the accumulation: count the squares
  bool in_micro_step_ = false;  // still set at the next begin: the backward between threw
  // The ranges an overwriting micro-step has written so far: if its backward throws, the rest
  // still holds an earlier step's gradients and is zeroed at the next begin.
  std::vector<ElementRange> overwritten_;
  int64_t peak_temporary_bytes_ = 0;  // the largest bucket-sized temporary on the GPU so far
};

}  // namespace zero
}  // namespace deepspeed
