// ZeRO-Offload's update during backward. With the fp32 masters in host memory
// (offload_optimizer "cpu") and an update that needs nothing from the whole gradient (FusedAdam,
// no gradient clipping, no fp16 overflow vote: ShardOptions.overlap_step), each range of the
// gradient partition is updated as soon as the accumulation boundary's backward has made it final
// (its bucket reduced), instead of after the whole backward:
//   engine thread  take(): the range's gradients down into pinned fp32 host memory (on a GPU
//                  asynchronously, on the compute stream, then a fence), a task posted;
//   worker thread  waits for the fence, runs the vectorised CPU Adam on that range of the masters
//                  (writing their 16-bit rounding into the pinned staging buffer in the same
//                  pass), then uploads the range into the device partition on a side stream.
// finish() (the engine's step) waits for the worker, updates what no bucket delivered (padding),
// and makes the compute stream wait for the uploads. The ranges give bit for bit what one step
// gives: the update is elementwise with the same constants.
// Why uploading early is safe: a range is final only after backward has run every node that
// reads its parameters, and the worker waits for a fence recorded after those nodes' kernels.
// With the partition on the CPU the same code runs with synchronous copies (tests; on a CPU-only
// machine it is opt-in, since backward already has the cores).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

#include "device/transfer_stream.h"
#include "offload/step_worker.h"
#include "optim/fused_adam.h"

namespace deepspeed {
namespace zero {

class StepDuringBackward {
 public:
  // `master`: the fp32 host masters, a parameter of `adam` (with the partition on the CPU and
  // fp32, the partition itself). `grad_host`: pinned fp32 gradients of the partition's size, where
  // gradients on a GPU land (undefined: allocated when the first arrive from a GPU). `upload`:
  // with the partition on a GPU, the host values that go up (the 16-bit staging buffer, or the
  // masters); undefined when the partition is in host memory (the update writes it directly).
  // `pin`: a gradient buffer allocated here is page-locked (offload_optimizer.pin_memory); from
  // pageable memory the copies still work, but synchronously.
  StepDuringBackward(optim::FusedAdam& adam, at::Tensor master, at::Tensor grad_host,
                     at::Tensor upload, c10::Device partition_device, bool pin);
  ~StepDuringBackward();

  // Elements [begin, begin + grads.numel()) of the gradient partition are final for this step.
  // `partition`: the resident parameter partition (its range is written by the upload).
  // REQUIRES: ranges of one step do not overlap.
  void take(int64_t begin, const at::Tensor& grads, const at::Tensor& partition);
  // Whether a range was taken since the last finish().
  bool started() const { return !taken_.empty(); }
  // Completes the step begun by take(): `grads` is the whole gradient partition. Rethrows a
  // worker's error.
  void finish(const at::Tensor& grads, const at::Tensor& partition);
  // Ranges the last completed step updated during backward (tests, logs).
  size_t ranges_in_last_step() const { return last_ranges_; }
  // Host bytes this object allocated itself (a pinned gradient buffer it was not given).
  int64_t own_bytes() const;

 private:
  // The range's fp32 host gradients: a pinned slice filled by an asynchronous copy on a GPU;
  // the gradients themselves (widened when 16-bit) on the CPU.
  at::Tensor host_gradients(int64_t begin, const at::Tensor& grads, bool blocking);
  void update(int64_t begin, const at::Tensor& host_grads, const at::Tensor& partition);
  std::vector<std::pair<int64_t, int64_t>> gaps() const;

  optim::FusedAdam& adam_;
  at::Tensor master_;
  at::Tensor grad_host_;  // gradients from a GPU land here
  bool grad_host_shared_ = false;  // grad_host_ was given (the shard counts it)
  at::Tensor upload_;     // partition on a GPU only
  c10::Device device_;
  bool pin_;
  optim::AdamRangeStep step_;
  std::vector<std::pair<int64_t, int64_t>> taken_;  // (begin, numel) this step
  size_t last_ranges_ = 0;
  device::SideStream uploads_;
  offload::StepWorker worker_;  // last: joined first, while the buffers above still exist
};

}  // namespace zero
}  // namespace deepspeed
