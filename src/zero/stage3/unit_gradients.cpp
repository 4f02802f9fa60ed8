#include "zero/stage3/unit_gradients.h"

#include <torch/torch.h>

#include "deepspeed/errors.h"
#include "offload/grad_store.h"
#include "zero/grad_partition.h"
#include "zero/no_optimizer_shard.h"

namespace deepspeed {
namespace zero {
namespace {

class GradientsInMemory final : public UnitGradients {
 public:
  GradientsInMemory(const Stage3Layout& layout, std::unique_ptr<GradPartition> partition,
                    ShardOptimizer& shard, ParamPartition& params)
      : layout_(layout), partition_(std::move(partition)), shard_(shard), params_(params) {}

  void begin_micro_step(bool boundary) override {
    boundary_ = boundary;
    partition_->begin_micro_step(boundary);
  }
  void accumulate(int unit, int64_t first, const at::Tensor& reduced) override {
    partition_->accumulate(layout_.units[unit].partition_offset + first, reduced);
  }
  void unit_complete(int unit) override {
    if (!boundary_ || !shard_.steps_during_backward()) return;
    // The unit's slice is final: ZeRO-Offload updates it now (zero/step_during_backward.h).
    const auto& slots = layout_.units[unit];
    shard_.gradients_final(slots.partition_offset,
                           partition_->tensor().narrow(0, slots.partition_offset,
                                                       slots.layout.partition_numel),
                           params_, partition_->written());
  }
  void end_micro_step() override { partition_->end_micro_step(); }
  at::Tensor squared_norm() override { return partition_->squared_norm(); }
  ShardGrads for_step() override {
    partition_->wait();
    return {partition_->tensor()};
  }
  void clear() override { partition_->clear(); }
  int64_t bytes() const override { return partition_->bytes(); }
  bool in_host_memory() const override { return partition_->in_host_memory(); }
  int64_t device_temporary_bytes() const override { return partition_->device_temporary_bytes(); }
  int64_t host_temporary_bytes() const override { return partition_->host_temporary_bytes(); }

 private:
  const Stage3Layout& layout_;
  std::unique_ptr<GradPartition> partition_;
  ShardOptimizer& shard_;
  ParamPartition& params_;
  bool boundary_ = false;
};

// An engine without an optimizer (zero/no_optimizer_shard.h) keeps no gradients: its backward is
// refused by the engine before the stage sees it. Dropping them (a checkpoint load does) is a
// no-op.
class NoGradients final : public UnitGradients {
 public:
  void begin_micro_step(bool) override { refuse(); }
  void accumulate(int, int64_t, const at::Tensor&) override { refuse(); }
  void unit_complete(int) override { refuse(); }
  void end_micro_step() override {}
  at::Tensor squared_norm() override { refuse(); }
  ShardGrads for_step() override { refuse(); }
  void clear() override {}
  int64_t bytes() const override { return 0; }
  bool in_host_memory() const override { return false; }
  int64_t device_temporary_bytes() const override { return 0; }

 private:
  [[noreturn]] static void refuse() {
    throw Error("ZeRO stage 3: a backward on an engine built without an optimizer (internal "
                "error: engine.backward() should have refused it)");
  }
};

class SwappedGradients final : public UnitGradients {
 public:
  SwappedGradients(const Stage3Layout& layout, at::ScalarType dtype, const ShardOptions& options,
                   const AioConfig& aio, c10::Device device)
      : device_(device),
        store_(layout, dtype, options.nvme_path, aio, offload::GradStore::stream_downloader(device)) {}

  void begin_micro_step(bool boundary) override { store_.begin_micro_step(boundary); }
  void accumulate(int unit, int64_t first, const at::Tensor& reduced) override {
    store_.accumulate(unit, first, reduced);  // no zero-filled slice first: see GradStore
  }
  void unit_complete(int unit) override { store_.unit_complete(unit); }
  void end_micro_step() override { store_.end_micro_step(); }
  at::Tensor squared_norm() override {  // summed as the swapped slices were closed
    return torch::full({1}, store_.squared_norm(),
                       torch::TensorOptions().dtype(torch::kDouble).device(device_));
  }
  ShardGrads for_step() override { return {at::Tensor(), &store_}; }
  void clear() override { store_.discard(); }
  int64_t bytes() const override { return store_.peak_resident_bytes(); }
  bool in_host_memory() const override { return true; }
  int64_t device_temporary_bytes() const override { return store_.peak_pending_device_bytes(); }
  int64_t file_bytes() const override { return store_.file_bytes(); }

 private:
  c10::Device device_;
  offload::GradStore store_;
};

}  // namespace

std::unique_ptr<UnitGradients> make_unit_gradients(const Stage3Layout& layout,
                                                   at::ScalarType dtype,
                                                   const ShardOptions& options,
                                                   const AioConfig& aio, c10::Device device,
                                                   ShardOptimizer& shard,
                                                   ParamPartition& params,
                                                   bool release_gradients) {
  if (is_no_optimizer_shard(shard)) return std::make_unique<NoGradients>();
  // A swapped optimizer swaps the gradients too, as DeepSpeed does; ZeRO-Offload's host update
  // reads them in host memory, where they then accumulate (no device partition).
  if (options.home == OffloadDevice::kNvme)
    return std::make_unique<SwappedGradients>(layout, dtype, options, aio, device);
  return std::make_unique<GradientsInMemory>(
      layout,
      make_grad_partition(layout.partition_numel, dtype, device, shard.gradients_in_host_memory(),
                          options.pin_memory, release_gradients),
      shard, params);
}

}  // namespace zero
}  // namespace deepspeed
