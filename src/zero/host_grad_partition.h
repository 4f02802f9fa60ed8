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
//
// Pageable (a GPU without pin_memory, DeepSpeed's default): a copy into pageable memory would
// block the host until the GPU reached the bucket, at every bucket of backward, so each bucket
// comes down into a page-locked copy instead (device/download.h) and the host writes or adds it
// into its place once that copy has arrived, checked without waiting at each later bucket; the
// host waits only beyond four copies pending, and in wait(). The GPU still holds no partition,
// only the buckets; the host holds the pageable partition and up to five bucket-sized page-locked
// copies. A later micro-step's add runs on the host, and so does the sum of squares of the values
// it produced (the boundary's overwrites are summed on the GPU as above). The fence accumulate()
// and written() give is a device::HostFence that the engine's thread passes when it has put the
// copy in: the update during backward waits on it from its own thread. clear() cancels the
// fences of copies it drops, so no waiter is left hanging after a failed backward.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include "device/download.h"
#include "device/download_queue.h"
#include "device/transfer_stream.h"
#include "util/ranges.h"
#include "zero/grad_partition.h"

namespace deepspeed {
namespace zero {

class HostGradPartition final : public GradPartition {
 public:
  // `numel` elements of `dtype` in host memory, page-locked for copies with `device` when `pin`
  // (offload_optimizer.pin_memory). `staged`: how buckets come down into a pageable partition
  // (device::stream_downloader on a GPU without pin; tests hold its fences back); null: straight
  // into the partition.
  HostGradPartition(int64_t numel, at::ScalarType dtype, c10::Device device, bool pin,
                    device::Downloader staged = nullptr);
  ~HostGradPartition() override;  // waits for copies still writing the buffer

  const at::Tensor& tensor() const override { return host_; }
  // A boundary restarts the sum of squares.
  void begin_micro_step(bool boundary) override;
  void end_micro_step() override { in_micro_step_ = false; }
  // The fence passes once the host holds the result (staged: once this thread put it in).
  std::shared_ptr<device::CopyFence> accumulate(int64_t begin, const at::Tensor& reduced) override;
  std::shared_ptr<device::CopyFence> written() override;
  // The boundary's sum of squared final values, accumulated on the device as the buckets came
  // down: ready for the compute stream (no host wait, no pass over host memory).
  at::Tensor squared_norm() override;
  // Waits for every copy issued so far.
  void wait() override;
  // The next micro-step writes instead of adding: no zeroing pass over host memory.
  void clear() override;
  bool in_host_memory() const override { return true; }
  int64_t device_temporary_bytes() const override;
  // The bytes asked for: libtorch's caching host allocator rounds each copy up to a power of two
  // and keeps the blocks for reuse.
  int64_t host_temporary_bytes() const override {
    return staged_ ? staged_->peak_host_bytes() : 0;
  }
  // Staged copies not yet in the partition (0 when not staged).
  size_t copies_pending() const { return staged_ ? staged_->size() : 0; }

 private:
  // Where a bucket's page-locked copy goes in the partition, and how (pageable only).
  struct StagedPlace {
    int64_t begin = 0;
    bool overwrite = false;      // the first micro-step since clear(): written, not added
    bool count_squares = false;  // a boundary's add: its result's squares are summed on the host
    std::shared_ptr<device::HostFence> in_place;  // passed once the copy is in the partition
  };
  std::shared_ptr<device::CopyFence> stage(int64_t begin, const at::Tensor& flat);
  // Writes or adds the staged copies in order: those arrived, or (`wait_all`) every one.
  void apply_staged(bool wait_all);
  void cancel_pending();
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
  // Set: the partition is pageable, buckets come staged.
  std::optional<device::DownloadQueue<StagedPlace>> staged_;
  std::shared_ptr<device::HostFence> last_staged_;  // the newest copy's fence (written())
  double host_squares_ = 0;  // the boundary's squares summed on the host (staged adds)
};

}  // namespace zero
}  // namespace deepspeed
