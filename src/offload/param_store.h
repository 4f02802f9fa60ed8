// Where a stage-3 rank's parameter partition (its slice of every unit, in the parameter dtype)
// lives: ZeRO-Infinity's parameter offload (zero_optimization.offload_param).
//
//   device "none" / "cpu": one tensor in memory. This build computes on the CPU, so host memory
//       *is* the compute device's memory and "cpu" offload moves nothing.
//   device "nvme": the root unit, then units 1, 2, ... while their slices total at most
//       max_in_cpu elements, stay in memory (a prefix of the partition: units are laid out in
//       order); every later unit's slice lives in a file under nvme_path, at a 4096-byte aligned
//       offset, and is read through io_uring (O_DIRECT) into a buffer when the unit is gathered.
//       start_fetch() reads ahead (prefetch), with at most buffer_count slices in memory at once;
//       a parameter whose partition (ceil(numel / world size)) is not smaller than buffer_size
//       elements is a ConfigError, as DeepSpeed asserts. The buffers are a pool of buffer_count,
//       each the size of the largest file slice (a whole unit's, not buffer_size), made as first
//       needed and kept (as DeepSpeed's parameter swapper keeps its buffers).
//   On a GPU the host memory ("cpu", "nvme": the in-memory part and the pool) is page-locked
//   whatever offload_param.pin_memory says, as DeepSpeed pins both, so a unit's upload from it
//   is asynchronous. A buffer whose slice a copy may still be reading (done() with that copy's
//   fence) is reused only once the fence has passed.
//
// The store is also the ParamSink of the swapped optimizer: each sub-group's updated 16-bit
// values are written straight back to their place (memory, or the file through two staging
// buffers whose writes overlap the next sub-group's update), for sub-groups from
// unit_aligned_groups(): none straddles two units, each starts at an aligned file offset.
//
// Not thread-safe: every call comes from the thread running the engine.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

#include "deepspeed/config.h"
#include "device/transfer_stream.h"
#include "offload/aio_queue.h"
#include "offload/aligned_buffer.h"
#include "offload/swapped_adam.h"
#include "offload/unit_file.h"
#include "zero/shard_optimizer.h"
#include "zero/stage3/unit_layout.h"

namespace deepspeed {
namespace offload {

class ParamStore : public zero::ParamPartition {
 public:
  // The in-memory part lives on `device` (the stage context's); file slices are read into host
  // buffers (direct I/O).
  ParamStore(const Stage3Layout& layout, at::ScalarType dtype, const ZeroConfig& zero,
             const AioConfig& aio, c10::Device device = c10::kCPU);
  ~ParamStore() override;

  bool swapped() const { return fd_ != nullptr; }
  bool in_memory(int unit) const { return unit < first_file_unit_; }

  // This rank's slice of `unit`: a view of the memory partition, or a buffer holding what the
  // file has (waiting for the read start_fetch began, if any). The buffer stays counted against
  // buffer_count, and *held* by the caller, until done(unit).
  at::Tensor fetch(int unit);
  // Begins reading `unit`'s slice if it lives in the file, is not read yet, and fewer than
  // buffer_count slices are in memory. Returns false when it could not start for that last reason.
  bool start_fetch(int unit);
  // The slice fetched for `unit` is no longer needed. `readers`: a copy that may still read it
  // (an upload on a side stream); its buffer is not written again before that has passed.
  void done(int unit, std::shared_ptr<device::CopyFence> readers = nullptr);

  // Who fetches slices and hands them back later (the gatherer: a gather in flight reads its
  // slice) gives the store a way to make it hand back every slice it holds, with the fences of
  // the copies still reading them. The store calls it before read_all, write or write_all
  // (checkpoints, the step, a modifier rank's edits) touch a held slice: those recycle a fetched
  // slice's buffer, and taking over a held one would hand out a buffer that a gather or an upload
  // still reads. Called on the engine's thread; null to unset.
  void set_hand_back(std::function<void()> hand_back) { hand_back_ = std::move(hand_back); }

  // Replaces `unit`'s slice (whole). Synchronous.
  void write(int unit, const at::Tensor& slice);
  // The whole partition as one new tensor, and its inverse (checkpoints, optimizers that are not
  // swapped: these materialise the partition in memory).
  at::Tensor read_all() override;
  void write_all(const at::Tensor& partition) override;
  // Elements [begin, begin + numel) of one of unit_aligned_groups()' sub-groups, as a tensor.
  at::Tensor read_group(int64_t begin, int64_t numel) override;

  // zero::ParamPartition: the shard optimizer's view of the partition.
  int64_t numel() const override { return layout_.partition_numel; }
  at::ScalarType dtype() const override { return dtype_; }
  at::Tensor resident() const override { return swapped() ? at::Tensor() : memory_; }
  std::vector<std::pair<int64_t, int64_t>> swap_groups(int64_t sub_group_size) const override {
    return unit_aligned_groups(layout_, sub_group_size);
  }

  // offload::ParamSink, for groups from unit_aligned_groups() (unit_file.h).
  void* begin_group(int64_t begin, int64_t numel) override;
  void end_group(int64_t begin, int64_t numel) override;
  void finish() override;

  // The in-memory part: the whole partition unless swapped().
  const at::Tensor& memory() const { return memory_; }
  // Whether resident_bytes() is host memory (offload_param, or a CPU engine).
  bool on_host() const { return !memory_.defined() || memory_.is_cpu(); }
  // The memory partition + the slice buffers held + the optimizer sink's staging buffers.
  int64_t resident_bytes() const;
  // The part of resident_bytes() in host memory: all of it when on_host(), else the page-locked
  // staging of begin_group for a partition on a GPU.
  int64_t host_bytes() const;
  int64_t file_bytes() const { return file_.file_bytes(); }
  const std::string& path() const { return path_; }

 private:
  struct Fetch {
    at::Tensor buffer;  // a pool buffer, or (fetch() beyond buffer_count) a one-off
    at::Tensor slice;   // the unit's elements at its start
    bool pooled = false;
    bool held = false;  // fetch() handed it out and done() has not come back for it
    offload::AioQueue::Ticket ticket = -1;  // the read, until waited for
  };
  struct FreeBuffer {
    at::Tensor buffer;
    std::shared_ptr<device::CopyFence> readers;  // null: nothing reads it
  };
  Fetch start_read(int unit);  // a buffer for the unit's slice, its read begun
  void drop_failed(std::map<int, Fetch>::iterator it);
  // Before the store recycles the fetched slice of unit `only` (-1: of every unit) itself: if it
  // is held, every holder hands its slices back; one still held then (a holder that did not
  // set_hand_back) is a logic_error naming `what`.
  void take_back_held(const char* what, int only);
  // A ConfigError naming offload_param.buffer_size, the parameter and both sizes, when a
  // parameter of file unit `unit` has a partition DeepSpeed's swapper would refuse.
  void check_buffer_size(int unit) const;
  // Host memory for `numel` elements, page-locked when the compute device is a GPU (pin_).
  at::Tensor pinned_if_gpu(int64_t numel, const char* what) const;
  int64_t device_stage_bytes() const;
  const Stage3Layout& layout_;
  at::ScalarType dtype_;
  int64_t element_size_;
  OffloadConfig config_;
  at::Tensor device_stage_;  // host staging for begin_group when memory_ is on a GPU
  at::Tensor memory_;          // units [0, first_file_unit_)
  int first_file_unit_;        // units from here on live in the file
  int64_t memory_numel_ = 0;   // = partition offset of first_file_unit_
  UnitFileLayout file_;
  std::string path_;
  std::unique_ptr<offload::DirectFile> fd_;
  std::unique_ptr<offload::AioQueue> queue_;
  std::map<int, Fetch> fetched_;
  std::function<void()> hand_back_;
  std::vector<FreeBuffer> free_;  // pool buffers not holding a fetched slice
  int pooled_ = 0;                // pool buffers made (at most buffer_count)
  int64_t pool_numel_ = 0;        // elements per pool buffer: the largest file slice
  bool pin_ = false;              // host memory page-locked for copies to device_ (a GPU)
  c10::Device device_;
  // Sub-group output staging for file units (two, so one's write overlaps the next update).
  offload::AlignedBuffer staging_[2];
  offload::AioQueue::Ticket staging_write_[2] = {-1, -1};
  int staging_next_ = 0;
};

}  // namespace offload
}  // namespace deepspeed
