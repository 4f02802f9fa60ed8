// The shard optimizer: this rank's fp32 master weights and optimizer moments for its partition,
// and where they live. Every ZeRO stage from 0 (16-bit) to 3 updates its partition through one of
// these, so the step, the checkpoint fragments and the load path exist once:
//
//   home none or cpu     InMemoryShard: a torch::optim::Optimizer over one fp32 tensor. When the
//                        partition itself is fp32 and in memory, the partition *is* the master
//                        (no second copy). This CPU build computes in host memory, so cpu
//                        offload is this same shard; a CUDA build keeps the masters in host memory
//                        while the partition is on the device.
//   home nvme            offload::SwappedShard (offload/swapped_shard.h): masters and moments in a
//                        file, streamed through the vectorised Adam one sub-group at a time.
//
// The stage hands the shard its partition as a ParamPartition (where the parameters in their
// training dtype live: a slice of the flat buffer, or stage 3's ParamStore) and its averaged
// gradients as ShardGrads. Not thread-safe; every call comes from the engine's thread.
#pragma once
#include <array>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>
#include <torch/optim/optimizer.h>

#include "offload/swapped_adam.h"  // ParamSink, GradSource
#include "zero/pending_update.h"
#include "zero/stage_options.h"

namespace deepspeed {
namespace device {
class CopyFence;
}
namespace zero {

using OptimizerFactory =
    std::function<std::shared_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

// This rank's partition of the trainable parameters, in their training dtype, wherever it lives.
// As a ParamSink it receives the updated values a swapped optimizer streams out.
class ParamPartition : public offload::ParamSink {
 public:
  virtual int64_t numel() const = 0;
  virtual at::ScalarType dtype() const = 0;
  // The whole partition as one tensor in memory (writes through), or undefined when it is not
  // (parameters swapped to a file).
  virtual at::Tensor resident() const = 0;
  virtual at::Tensor read_all() = 0;                  // a copy of the whole partition
  virtual void write_all(const at::Tensor& values) = 0;  // any float dtype, converted
  virtual at::Tensor read_group(int64_t begin, int64_t numel) = 0;
  // How a swapped optimizer must cut the partition into sub-groups (empty: every sub_group_size
  // elements). Stage 3 cuts at unit boundaries so each sub-group is one aligned file region.
  virtual std::vector<std::pair<int64_t, int64_t>> swap_groups(int64_t sub_group_size) const {
    return {};
  }
};

// A partition that is one tensor in memory (stages 0-2: a slice of the flat buffer).
class TensorPartition : public ParamPartition {
 public:
  explicit TensorPartition(at::Tensor slice) : slice_(std::move(slice)) {}
  int64_t numel() const override { return slice_.numel(); }
  at::ScalarType dtype() const override { return slice_.scalar_type(); }
  at::Tensor resident() const override { return slice_; }
  at::Tensor read_all() override { return slice_.clone(); }
  void write_all(const at::Tensor& values) override { slice_.copy_(values); }
  at::Tensor read_group(int64_t begin, int64_t numel) override { return slice_.narrow(0, begin, numel); }
  // A swapped optimizer writes each group on the host; a partition on a GPU gets it through a
  // host staging buffer, copied up at end_group.
  void* begin_group(int64_t begin, int64_t numel) override;
  void end_group(int64_t begin, int64_t numel) override;

 private:
  at::Tensor slice_;
  at::Tensor stage_;  // host staging for a partition on a GPU
};

// The averaged gradients of the partition: one tensor in memory, or (stage 3 with a swapped
// optimizer) a source that reads them back sub-group by sub-group.
struct ShardGrads {
  at::Tensor tensor;                      // 1-D, partition numel, any float dtype
  offload::GradSource* source = nullptr;  // when set, tensor is undefined
};

// A shard's checkpoint state cut into windows of the partition (in memory: one window of views;
// swapped: one sub-group at a time, read into a buffer the shard already holds). Not
// thread-safe, and no step() may run while windows are open.
class StateWindows {
 public:
  virtual ~StateWindows() = default;
  // (begin, numel) of each window, in partition order, tiling [0, partition numel).
  const std::vector<std::pair<int64_t, int64_t>>& ranges() const { return ranges_; }
  // [master, exp_avg, exp_avg_sq] of window k: 1-D views of its elements, fp32, or 16-bit where
  // the state is (low-precision masters, bf16 moments: checkpoints widen them saving and round
  // into them loading); moments undefined when the optimizer keeps none. Valid until the
  // next open() or finish(). For loading, what is written into them reaches the state when
  // another window opens or at finish().
  virtual std::array<at::Tensor, 3> open(size_t k) = 0;
  // Loading: the open window goes back to the state. Call once, at the end.
  virtual void finish() {}

 protected:
  std::vector<std::pair<int64_t, int64_t>> ranges_;
};

class ShardOptimizer : public PendingUpdate {
 public:
  virtual ~ShardOptimizer() = default;
  // One update: gradients times grad_scale, the optimizer's rule, the new values written into
  // `params` (rounded to its dtype). `grads.tensor` may be scaled in place.
  virtual void step(const ShardGrads& grads, ParamPartition& params, double grad_scale) = 0;
  // ZeRO-Offload's update during backward (zero/step_during_backward.h): whether the stage
  // should hand over each range of its gradient partition as soon as the boundary's backward
  // has made it final. The next step() completes the update (when the ranges were already
  // updated, its grad_scale must be 1), or discard_step() drops it (fp16 overflow).
  virtual bool steps_during_backward() const { return false; }
  // `ready`: gradients kept in host memory (gradients_in_host_memory()) are there once it passed.
  virtual void gradients_final(int64_t begin, const at::Tensor& grads, ParamPartition& params,
                               std::shared_ptr<device::CopyFence> ready) {}
  // Whether the update reads the gradients in host memory (ZeRO-Offload's FusedAdam step): the
  // reduce-scatter stages then keep their gradient partition there (zero/host_grad_partition.h),
  // not on the device.
  virtual bool gradients_in_host_memory() const { return false; }
  virtual void discard_step() {}
  // A backward begins (every micro-step), as abandon_step(): ranges still taken from an earlier
  // boundary's backward (it threw, or no step followed) are dropped once the update thread has
  // stopped, so it cannot race the new micro-step's gradients and forward, and the ranges a
  // failed pass's recovery still finishes are ignored until accept_ranges(). If a step is lost,
  // this throws deepspeed::Error saying so (once).
  virtual void begin_backward() {}
  // The stage's backward threw: the update during backward stops (the worker and its uploads
  // are waited for; a step it already counted is lost, step_lost()), and ranges the failed pass
  // still finishes are ignored until accept_ranges() (the next backward has begun).
  virtual void abandon_step() {}
  virtual void accept_ranges() {}
  // A step counted and partly updated during backward was never completed: step() and the next
  // begin_backward throw deepspeed::Error saying so (the backward once, clearing it); a load of
  // the optimizer states (finish_load) clears it.
  virtual bool step_lost() const { return false; }
  // How many ranges the last step took during backward (tests, logs).
  virtual size_t ranges_stepped_during_backward() const { return 0; }
  // Ranges were updated during the boundary's backward and no step() has completed them.
  virtual bool update_begun_during_backward() const { return false; }
  // offload_optimizer.overlap_forward (zero/forward_waits.h): step() hands the update's last
  // ranges over instead of waiting for them; they run into what the engine does next, those the
  // next forward reads first first: `first_read(begin, end)` is when it first reads elements
  // [begin, end) of the partition (lower: sooner).
  virtual bool finishes_in_forward() const { return false; }
  void set_forward_order(ReadOrder first_read) { first_read_ = std::move(first_read); }
  // Elements [begin, end) of the partition hold the last step's values (and, on a GPU, the
  // compute stream waits for them): nothing to do unless step() handed its update over.
  void settle(int64_t /*begin*/, int64_t /*end*/) override {}
  // Every element does: the handed-over update is complete. A failed update throws (the step is
  // then lost: step_lost()).
  void complete_step() override {}
  // step() handed its update over and complete_step() has not run since.
  virtual bool step_handed_over() const { return false; }
  // The optimizer the engine and the LR scheduler see (its param group carries lr etc.).
  virtual std::shared_ptr<torch::optim::Optimizer> optimizer() const = 0;

  // ---- checkpoints ----
  // [master, exp_avg, exp_avg_sq] over the whole partition, fp32, 1-D: the moments as
  // zero/moment_state.h's moments_of gives them (Lion's exp_avg and Adagrad's sum in the first
  // slot, the second undefined). Undefined when the optimizer keeps none (not one of those
  // families, or no state yet unless create_moments). For
  // saving, reading them saves; after state_for_load(), writing them and then finish_load()
  // loads. A swapped shard returns copies read from its file.
  virtual std::array<at::Tensor, 3> state_for_save() = 0;
  virtual std::array<at::Tensor, 3> state_for_load(bool create_moments) = 0;
  // The same state in windows (what checkpoints use: a swapped shard's whole state is never in
  // memory). After windows_for_load(..)->finish(), finish_load() completes the load.
  virtual std::unique_ptr<StateWindows> windows_for_save() = 0;
  virtual std::unique_ptr<StateWindows> windows_for_load(bool create_moments) = 0;
  // After the state_for_load() tensors or the load windows were written: the Adam step count
  // (when >= 0) is set and `params` receives the masters.
  virtual void finish_load(int64_t adam_step, ParamPartition& params) = 0;
  // The moment state's step count (Adam family, Lion: zero/moment_state.h), 0 before the first
  // step, -1 for other optimizers.
  virtual int64_t adam_step() const = 0;
  // The parameters were edited outside the optimizer (load_module_only, GatheredParameters with
  // a modifier rank): the masters are taken from `params`.
  virtual void refresh_masters(ParamPartition& params) = 0;
  // Elements [begin, begin + values.numel()) of `params` were just set to `values` outside the
  // optimizer: the masters there follow (the others keep their fp32 precision).
  virtual void masters_edited(ParamPartition& params, int64_t begin, const at::Tensor& values) = 0;

  // Optimizer-state bytes held in memory (masters that are not the partition, moments, buffers).
  virtual int64_t resident_bytes() const = 0;
  // The part of resident_bytes() in host memory (all of it unless the masters are on a GPU).
  virtual int64_t resident_host_bytes() const { return resident_bytes(); }
  // Bytes of optimizer state in a swap file (offload_optimizer "nvme"), beside memory.
  virtual int64_t file_bytes() const { return 0; }

 protected:
  ReadOrder first_read_ = [](int64_t, int64_t) { return int64_t{0}; };
};

// The windows of state held whole in memory: one window of views.
std::unique_ptr<StateWindows> whole_state_windows(std::array<at::Tensor, 3> state);

// Builds the shard for `params` in its configured home. `make_optimizer` builds the optimizer
// over the given fp32 tensors; empty: an engine without an optimizer, whose shard holds nothing
// (zero/no_optimizer_shard.h). Throws ConfigError when the home cannot run that optimizer
// (NVMe: Adam/AdamW only), IOError for a bad nvme_path.
std::unique_ptr<ShardOptimizer> make_shard_optimizer(const ShardOptions& options,
                                                     ParamPartition& params,
                                                     const OptimizerFactory& make_optimizer);

}  // namespace zero
}  // namespace deepspeed
