// Stage 3's gradient partition in a swap file (ZeRO-Infinity: with offload_optimizer.device =
// "nvme" the gradients go to the optimizer's folder, as DeepSpeed swaps them with the states).
//
// During backward each unit's slice is accumulated in memory only while its buckets are being
// reduced: accumulate(u, first, received) adds a bucket's reduced part to it, open(u) gives it
// (zeros on the first micro-step after a step, else the sum so far read back from the file),
// close(u) writes it back (asynchronously) and frees it. On the first micro-step after a step the
// slice is not zero-filled first: each element's first accumulate writes 0 + received (so a -0
// becomes +0 exactly as before) and only elements no bucket covered are zeroed, at open or close.
// A freed slice or read buffer is kept as a spare until the next one of the same size is needed
// (usually at once), instead of a fresh allocation (and its page faults) per unit per micro-step;
// the spare is dropped at the end of each micro-step and step, so it adds nothing to the peak.
// On the boundary micro-step close() also adds the slice's squares to the gradient norm, so the
// step needs no second pass over the file. The optimizer then reads the gradients sub-group by sub-group
// (offload::GradSource), ahead of its update. Resident: the open slices and the reads in flight.
//
// Not thread-safe: every call comes from the thread running the engine.
#pragma once
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

#include "deepspeed/config.h"
#include "offload/aio_queue.h"
#include "offload/swapped_adam.h"
#include "offload/unit_file.h"
#include "zero/stage3/unit_layout.h"

namespace deepspeed {
namespace offload {

class GradStore : public offload::GradSource {
 public:
  // dir: offload_optimizer.nvme_path (IOError naming it unless it exists).
  GradStore(const Stage3Layout& layout, at::ScalarType dtype, const std::string& dir,
            const AioConfig& aio);
  ~GradStore() override;

  void begin_micro_step(bool boundary);
  // Elements [first, first + received.numel()) of unit u's slice += received (any float dtype).
  // REQUIRES: within a micro-step, the ranges of one unit do not overlap (a unit's buckets).
  void accumulate(int unit, int64_t first, const at::Tensor& received);
  at::Tensor open(int unit);
  void close(int unit);
  // The micro-step's writes are on disk; the file now holds the accumulated gradients.
  void end_micro_step();
  double squared_norm() const { return squared_norm_; }  // of the last boundary micro-step
  void discard();  // the accumulated gradients are dropped (after a step, or an overflow)

  // offload::GradSource, for sub-groups from unit_aligned_groups().
  void prefetch(int64_t begin, int64_t numel) override;
  at::Tensor get(int64_t begin, int64_t numel) override;
  void release(int64_t begin, int64_t numel) override;

  int64_t resident_bytes() const;  // open slices, writes and reads in flight (not the pool)
  int64_t peak_resident_bytes() const { return peak_resident_; }
  int64_t pooled_bytes() const;    // a freed buffer kept for reuse
  int64_t file_bytes() const { return file_.file_bytes(); }
  const std::string& path() const { return path_; }

 private:
  struct Io {
    at::Tensor buffer;
    offload::AioQueue::Ticket ticket = -1;
  };
  // A slice being accumulated. `fresh`: the first micro-step after a step, the buffer not
  // zeroed; `covered` lists the element ranges written so far (the rest is garbage).
  struct Open {
    at::Tensor slice;
    bool fresh = false;
    std::vector<std::pair<int64_t, int64_t>> covered;
  };
  Open& acquire_slice(int unit);
  void zero_uncovered(Open& open);
  at::Tensor take_buffer(int64_t numel);
  void recycle(at::Tensor buffer);
  void note_resident();

  const Stage3Layout& layout_;
  at::ScalarType dtype_;
  UnitFileLayout file_;
  std::string path_;
  std::unique_ptr<offload::DirectFile> fd_;
  std::unique_ptr<offload::AioQueue> queue_;
  bool boundary_ = true;
  bool accumulated_ = false;  // the file holds this step's gradients of earlier micro-steps
  double squared_norm_ = 0;
  std::map<int, Open> open_;           // unit -> slice being accumulated
  std::deque<at::Tensor> pool_;        // freed buffers, oldest first
  std::deque<Io> writing_;             // closed slices on their way to the file
  std::map<int64_t, Io> reading_;      // sub-group begin -> its gradients (optimizer step)
  int64_t peak_resident_ = 0;
};

}  // namespace offload
}  // namespace deepspeed
