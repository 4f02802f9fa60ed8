// Stage 3's gradient partition in a swap file (ZeRO-Infinity: with offload_optimizer.device =
// "nvme" the gradients go to the optimizer's folder, as DeepSpeed swaps them with the states).
//
// During backward each unit's slice is accumulated in host memory only while its buckets are being
// reduced: accumulate(u, first, reduced) adds a bucket's reduced part to it, unit_complete(u)
// says every bucket of u is in, and the slice is written back (asynchronously) and freed. A slice
// is zeros on the first micro-step after a step, else the sum so far read back from the file. On
// the first micro-step after a step the slice is not zero-filled first: each element's first
// accumulate writes 0 + received (so a -0 becomes +0 exactly as before) and only elements no
// bucket covered are zeroed, at close.
//
// A bucket reduced on a GPU comes down without stopping the host: it is copied into page-locked
// memory on a download stream (a Download, whose fence passes once it is there), and added into
// its slice once that fence has passed, which each later call checks without waiting. Only when
// more than a few downloads are pending, or at the end of the micro-step, does the host wait. A
// unit completes when its last download has been added. On the CPU the bucket is added at once.
//
// A freed slice or read buffer is kept as a spare until the next one of the same size is needed
// (usually at once), instead of a fresh allocation (and its page faults) per unit per micro-step;
// the spare is dropped at the end of each micro-step and step, so it adds nothing to the peak.
// On the boundary micro-step close() also adds the slice's squares to the gradient norm, so the
// step needs no second pass over the file. The optimizer then reads the gradients sub-group by sub-group
// (offload::GradSource), ahead of its update. Resident: the open slices, the downloads pending and
// the reads and writes in flight.
//
// Not thread-safe: every call comes from the thread running the engine.
#pragma once
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

#include "deepspeed/config.h"
#include "device/download.h"
#include "device/download_queue.h"
#include "offload/aio_queue.h"
#include "offload/swapped_adam.h"
#include "offload/unit_file.h"
#include "zero/stage3/unit_layout.h"

namespace deepspeed {
namespace offload {

class GradStore : public offload::GradSource {
 public:
  using Download = device::Download;
  using Downloader = device::Downloader;
  static Downloader stream_downloader(c10::Device device) {
    return device::stream_downloader(device);
  }

  // dir: offload_optimizer.nvme_path (made when missing; IOError naming it if it cannot be). `download`: how a
  // reduced bucket reaches host memory (stream_downloader(device); tests hold fences back).
  GradStore(const Stage3Layout& layout, at::ScalarType dtype, const std::string& dir,
            const AioConfig& aio, Downloader download = stream_downloader(c10::kCPU));
  ~GradStore() override;

  void begin_micro_step(bool boundary);
  // Elements [first, first + reduced.numel()) of unit u's slice += reduced (any float dtype, on
  // the host or the compute device), once it has come down.
  // REQUIRES: within a micro-step, the ranges of one unit do not overlap (a unit's buckets).
  void accumulate(int unit, int64_t first, const at::Tensor& reduced);
  // Every bucket of unit u has been accumulated this micro-step: its slice goes back to the file
  // (even if this rank received nothing, so the file is written) once the last has come down.
  void unit_complete(int unit);
  // The slice of unit u, to add to directly (the host arithmetic of accumulate), and its return.
  at::Tensor open(int unit);
  void close(int unit);
  // The micro-step's downloads are added and its writes are on disk; the file now holds the
  // accumulated gradients.
  void end_micro_step();
  double squared_norm() const { return squared_norm_; }  // of the last boundary micro-step
  void discard();  // the accumulated gradients are dropped (after a step, or an overflow)

  // offload::GradSource, for sub-groups from unit_aligned_groups().
  void prefetch(int64_t begin, int64_t numel) override;
  at::Tensor get(int64_t begin, int64_t numel) override;
  void release(int64_t begin, int64_t numel) override;

  // Open slices, writes and reads in flight, and the host copies of downloads not yet added
  // (not the pool).
  int64_t resident_bytes() const;
  int64_t peak_resident_bytes() const { return peak_resident_; }
  // The buckets on the compute device that downloads still coming down keep allocated (the
  // host waits beyond four pending), now and at most.
  int64_t pending_device_bytes() const;
  int64_t peak_pending_device_bytes() const { return downloads_.peak_device_bytes(); }
  int64_t pooled_bytes() const;    // a freed buffer kept for reuse
  int64_t file_bytes() const { return file_.file_bytes(); }
  const std::string& path() const { return path_; }

 private:
  struct Io {
    at::Tensor buffer;
    offload::AioQueue::Ticket ticket = -1;
  };
  // Where a bucket's download goes: elements [first, ...) of the unit's slice.
  struct SlicePlace {
    int unit = 0;
    int64_t first = 0;
  };
  // A slice being accumulated. `fresh`: the first micro-step after a step, the buffer not
  // zeroed; `covered` lists the element ranges written so far (the rest is garbage).
  struct Open {
    at::Tensor slice;
    bool fresh = false;
    std::vector<std::pair<int64_t, int64_t>> covered;
  };
  Open& acquire_slice(int unit);
  void add_into_slice(int unit, int64_t first, const at::Tensor& host_values);
  // Adds the pending downloads in order: those already there, or (`wait_all`) every one.
  void apply_downloads(bool wait_all);
  void drop_downloads();
  void finish_writes();  // waits for the closed slices' writes, their buffers back to the pool
  void wait_oldest_write();  // a failure is remembered in write_failed_
  void check_no_failed_write() const;
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
  device::DownloadQueue<SlicePlace> downloads_;  // not yet added, in the order they were queued
  std::map<int, int> pending_of_;     // unit -> its downloads in downloads_
  std::set<int> completing_;          // units complete but for a pending download
  bool boundary_ = true;
  bool accumulated_ = false;  // the file holds this step's gradients of earlier micro-steps
  std::set<int> in_file_;     // else: units a failed first micro-step wrote there all the same
  bool in_micro_step_ = false;  // between begin_micro_step and end_micro_step
  double squared_norm_ = 0;
  std::string write_failed_;  // a slice's write failed: the accumulation is incomplete
  std::map<int, Open> open_;           // unit -> slice being accumulated
  std::deque<at::Tensor> pool_;        // freed buffers, oldest first
  std::deque<Io> writing_;             // closed slices on their way to the file
  std::map<int64_t, Io> reading_;      // sub-group begin -> its gradients (optimizer step)
  int64_t peak_resident_ = 0;
};

}  // namespace offload
}  // namespace deepspeed
