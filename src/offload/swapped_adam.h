// Adam whose master weights and moments live in files (ZeRO-Infinity's NVMe optimizer
// offload): only `buffer_count` sub-groups are in memory at any time.
//
// The rank's partition is cut into sub-groups of sub_group_size elements; sub-group k is one file
// region holding [master | exp_avg | exp_avg_sq]. step() walks the sub-groups through a ring of
// buffer_count buffers so that reading sub-group k+1 and writing sub-group k-1 run while k is
// being updated (buffer_count >= 3 gives that full overlap; 2 overlaps only the read):
//     wait read k -> update k (vectorised Adam, 16-bit copy written into the model) -> write k
//     -> wait write of the sub-group that last used the next buffer -> read k + buffer_count - 1
// The state is fp32 (12 bytes an element), or low-precision (DeepSpeed's
// bf16/fp16_master_weights_and_grads: a 16-bit master, with bf16.bf16_optimizer_states bf16
// moments too): 10 or 6 bytes an element, in the file and in each buffer, and as much less disk
// traffic a step. The update widens each format in cache (optim/cpu_adam.h adam_step_buffers).
// Resident memory: buffer_count * (bytes an element) * sub_group_size (each buffer a whole
// sub-group's state), plus, where gradients may be in device memory, 4 * sub_group_size for one
// sub-group of them brought down; gradients in host memory are read where they are, in their
// dtype.
//
// Not thread-safe. The file has no name in the folder (create_swap_file): its space goes back
// when the object is destroyed, or however the process ends.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/Tensor.h>

#include "offload/aio_queue.h"
#include "offload/aligned_buffer.h"
#include "optim/adam_runs.h"
#include "optim/cpu_adam.h"

namespace deepspeed::offload {

struct SwapOptions {
  std::string dir;                    // offload_optimizer.nvme_path (+ a per-rank folder)
  int64_t sub_group_size = 1000000000;  // zero_optimization.sub_group_size (elements)
  int buffer_count = 4;               // offload_optimizer.buffer_count
  AioOptions aio;
  // Explicit sub-groups as (begin, numel), covering [0, numel) in order. Empty: cut every
  // sub_group_size elements. Stage 3 with swapped parameters cuts at unit boundaries instead, so
  // that each sub-group's 16-bit output is one aligned region of the parameter file.
  std::vector<std::pair<int64_t, int64_t>> groups;
  // The state's formats: fp32 masters and moments, or a 16-bit master (the model's dtype) with
  // fp32 or bf16 moments (fp16 moments are refused).
  optim::AdamElem master_format = optim::AdamElem::F32;
  optim::AdamElem moment_format = optim::AdamElem::F32;
  // The gradients may be in device memory (a GPU's stages 1 and 2): a landing buffer for one
  // sub-group of them is kept from the start. (Host gradients that are not contiguous get one
  // when the first comes.)
  bool device_gradients = false;
};

// Where step() puts each sub-group's updated parameters (the model's 16-bit or fp32 copy).
class ParamSink {
 public:
  virtual ~ParamSink() = default;
  // Memory for elements [begin, begin + numel) of the output, valid until end_group.
  virtual void* begin_group(int64_t begin, int64_t numel) = 0;
  virtual void end_group(int64_t begin, int64_t numel) = 0;
  // Every group's output has reached its final place (called once, after the last group).
  virtual void finish() {}
};

// Sub-group [begin, begin + numel) of a 1-D source, in any float dtype (the initial masters).
using GroupSource = std::function<at::Tensor(int64_t begin, int64_t numel)>;

// Where step() reads each sub-group's gradient. prefetch() is called in sub-group order as the
// sub-group's state read is issued (at most buffer_count ahead of the update), get() when it is
// updated, release() right after.
class GradSource {
 public:
  virtual ~GradSource() = default;
  virtual void prefetch(int64_t /*begin*/, int64_t /*numel*/) {}
  virtual at::Tensor get(int64_t begin, int64_t numel) = 0;  // 1-D, any float dtype
  virtual void release(int64_t /*begin*/, int64_t /*numel*/) {}
};

struct SwapStats {
  double seconds_waiting_read = 0;   // step() blocked on a read (not hidden behind compute)
  double seconds_waiting_write = 0;
  double seconds_updating = 0;
  int64_t bytes_read = 0, bytes_written = 0;
};

class SwappedAdam {
 public:
  // Creates the swap files under options.dir (made when missing; IOError naming it if it cannot be) and
  // writes `initial_master` (any float dtype, 1-D) converted to the master format, with zero
  // moments.
  SwappedAdam(const at::Tensor& initial_master, SwapOptions options);
  // Same, reading the initial masters one sub-group at a time (never the whole partition at once).
  SwappedAdam(int64_t numel, const GroupSource& initial_master, SwapOptions options);
  ~SwappedAdam();

  // One update of the whole partition. grad: 1-D, numel(), fp32, bf16 or fp16 (read as it is;
  // another dtype is widened per sub-group). param_out: 1-D, numel(), fp32 or bf16/fp16:
  // receives the updated master (16-bit rounding fused into the Adam pass). hp.step is the
  // 1-based step count.
  void step(const at::Tensor& grad, at::Tensor param_out, const optim::AdamStepParams& hp);
  // Same, with each sub-group's output going to `sink` in `out_dtype` (fp32, bf16 or fp16).
  void step(const at::Tensor& grad, ParamSink& sink, at::ScalarType out_dtype,
            const optim::AdamStepParams& hp);
  // Same, with the gradients read sub-group by sub-group from `grads` (swapped gradients).
  void step(GradSource& grads, ParamSink& sink, at::ScalarType out_dtype,
            const optim::AdamStepParams& hp);
  // The last two with the constants by run of elements (a client optimizer's parameter groups
  // over the partition, zero/flat_groups.h): a sub-group is updated run by run, cut where they
  // meet. REQUIRES: `runs` cover [0, numel()) in order; the same step count in each.
  void step(const at::Tensor& grad, ParamSink& sink, at::ScalarType out_dtype,
            const std::vector<optim::AdamHyperRun>& runs);
  void step(GradSource& grads, ParamSink& sink, at::ScalarType out_dtype,
            const std::vector<optim::AdamHyperRun>& runs);

  // Replaces the masters with `source` sub-group by sub-group, keeping the moments (parameters
  // edited outside the optimizer: GatheredParameters with a modifier rank). Values are rounded
  // to nearest even into a 16-bit master format, as Tensor::to does.
  void reset_masters(const GroupSource& source);
  // Masters [begin, begin + values.numel()) become `values` (any float dtype, converted); only
  // the sub-groups overlapping that range are read and rewritten.
  void set_masters(int64_t begin, const at::Tensor& values);

  // The whole state as fp32 tensors (tests, small tools): master, exp_avg, exp_avg_sq (16-bit
  // formats widened, exactly; written back rounded).
  std::array<at::Tensor, 3> read_state();
  void write_state(const at::Tensor& master, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq);

  // The state one sub-group at a time, through the first ring buffer (checkpoints of a state
  // larger than memory; no allocation). (begin, numel) of each sub-group, in order:
  std::vector<std::pair<int64_t, int64_t>> group_ranges() const;
  // Reads sub-group k: its [master, exp_avg, exp_avg_sq] as views of the buffer in their formats
  // (fp32 unless low-precision: callers convert, as checkpoints do), valid until the next call
  // of read_group, step, reset_masters, read_state, write_state or write_masters.
  std::array<at::Tensor, 3> read_group(size_t k);
  // Writes the buffer back as sub-group k. REQUIRES: the last read_group was of k.
  void write_group(size_t k);
  // Every master, converted to `dtype` (fp32, bf16, fp16) as Tensor::to would, goes to `sink`
  // sub-group by sub-group (after a load: the parameters follow the loaded masters).
  void write_masters(ParamSink& sink, at::ScalarType dtype);

  int64_t numel() const { return numel_; }
  int64_t resident_bytes() const;   // the ring of buffers (and the gradients' landing buffer)
  int64_t file_bytes() const;       // bytes of state on disk
  bool direct_io() const;
  const SwapStats& stats() const { return stats_; }
  // Sub-groups the last step() updated (its parameters' output, and the state it writes back).
  // After a step() that threw: 0 means the state and the parameters are still the step's
  // starting point (a retry is clean); more, that the step was left half done.
  int64_t groups_updated() const { return groups_updated_; }
  const std::string& path() const { return path_; }

 private:
  struct Group {
    int64_t begin = 0, numel = 0;   // elements of the partition
    int64_t offset = 0, bytes = 0;  // region in the file (aligned)
    // Byte offsets in the region of [master | exp_avg | exp_avg_sq], each on a 64-byte boundary.
    std::array<int64_t, 3> at{};
  };
  void make_groups();
  // Array `which` (0 master, 1 exp_avg, 2 exp_avg_sq) of sub-group g in a buffer at `base`, in
  // its format.
  at::Tensor view(void* base, const Group& g, int which) const;
  optim::AdamBuffers buffers(void* base, const Group& g) const;
  void fill(int64_t group, void* base, const at::Tensor& source, int which) const;
  // Sub-group g's gradients where the update can read them, and their format: host ones where
  // they are, others brought into the landing buffer.
  std::pair<const void*, optim::AdamElem> readable_grads(const at::Tensor& grad, const Group& g);
  // Reads each sub-group, lets `edit` change its buffer (view() gives the arrays), writes it
  // back. Synchronous.
  void rewrite_groups(const std::function<void(const Group&, void* base)>& edit);

  int64_t numel_;
  SwapOptions options_;
  std::string path_;
  std::unique_ptr<DirectFile> file_;
  AioQueue queue_;
  std::vector<Group> groups_;
  std::vector<AlignedBuffer> ring_;
  int64_t max_group_numel_ = 0;
  AlignedBuffer grad_landing_;  // one sub-group of gradients from device memory (4 B an element)
  int64_t group_in_buffer_ = -1;  // read_group's sub-group in ring_[0], -1 when none
  int64_t groups_updated_ = 0;
  SwapStats stats_;
};

}  // namespace deepspeed::offload
