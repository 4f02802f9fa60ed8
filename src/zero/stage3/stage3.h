// ZeRO stage 3: parameters, gradients and optimizer states all partitioned (16Ψ/N per rank,
// fp32: 4Ψ/N parameters that double as master + 4Ψ/N gradients + 8Ψ/N moments; 16-bit: 2Ψ/N
// parameters + 2Ψ/N gradients + 12Ψ/N fp32 master and moments), plus the gathered working set.
//
// The model marks its units with ZeroUnit/LayerList (deepspeed/zero_unit.h); the layout
// (unit_layout.h) assigns each trainable parameter to a unit and each rank a slice of every unit.
// The UnitGatherer decides when a unit's parameters are gathered and released. Gradients: as
// autograd finishes a parameter's gradient (AccumulateGrad post hook) it is copied into its
// bucket (a run of reduce_bucket_size elements of its unit) and freed; a complete bucket is
// reduce-scattered unevenly (each rank receives the part inside its slice, added to its gradient
// partition) once every bucket before it in the launch order has gone: the units last to first,
// the root unit last, each unit's buckets last to first (BucketOrder, as stages 0-2). A rank whose
// gradients come in another order (a parameter used on some ranks only) holds a complete bucket,
// and its buffer, until its turn, so every rank issues the same reduce-scatters in the same
// order (all-gathers of units during backward fall between them alike only when every rank uses
// the same parameters: docs/zero3.md, Limits).
// When all of a unit's trainable parameters have their gradient, the unit's backward is over and
// it is released. A parameter the loss's graph cannot reach (zero/backward_reach.h) counts as
// arrived when the backward begins, its part of the bucket zeros. Buckets whose hooks still never
// all fired (the graph could not tell: an activation-checkpointed segment) are reduced at
// end_backward, in order; a unit one of whose parameters got no gradient then stays gathered
// until then (a warning names the parameter, once per unit).
// Every micro-step reduces (as stage 2). ZeRO++ (zeropp_options.h): qwZ and hpZ live in the
// gatherer; qgZ replaces the buckets' reduce_scatter_v with quantized_reduce_scatter_v.
// After the optimizer step the rank's partition holds the new values (the fused Adam writes the
// 16-bit copy); only the root unit is gathered again.
// The partition lives in a ParamStore (memory, or a swap file under offload_param nvme: ZeRO-
// Infinity); the fp32 masters and moments in the shard optimizer (zero/shard_optimizer.h: memory,
// or a file under offload_optimizer nvme); the gradients where the shard's update reads them
// (zero/stage3/unit_gradients.h).
#pragma once
#include <array>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "offload/param_store.h"
#include "zero/bucket_order.h"
#include "zero/gradient_hooks.h"
#include "zero/in_flight.h"
#include "zero/shard_optimizer.h"
#include "zero/stage.h"
#include "zero/stage_options.h"
#include "zero/stage3/quantized_reduce.h"
#include "zero/stage3/unit_gatherer.h"
#include "zero/stage3/unit_gradients.h"
#include "zero/stage3/unit_layout.h"
#include "zero/stage3/zeropp_options.h"

namespace deepspeed {
namespace zero {

class Stage3 : public ZeroStage {
 public:
  // Partitions the model's units (adopting zero::Init slices one unit at a time) and attaches
  // itself to them. REQUIRES: every rank holds rank 0's values for parameters not built under
  // zero::Init; every trainable parameter has options.param_dtype. COLLECTIVE. An empty
  // `make_optimizer`: an engine without an optimizer, which partitions and gathers but keeps no
  // masters, moments or gradients (zero/no_optimizer_shard.h).
  Stage3(torch::nn::Module& model, std::vector<at::Tensor> trainable, const StageContext& context,
         const Stage3Options& options, const OptimizerFactory& make_optimizer);
  ~Stage3() override;

  void begin_backward(bool boundary) override;
  void expect_gradients_from(const at::Tensor& root) override;
  void end_backward(bool boundary) override;
  void abandon_backward() override;
  size_t ranges_stepped_during_backward() const override {
    return shard_->ranges_stepped_during_backward();
  }
  bool update_begun_during_backward() const override {
    return shard_->update_begun_during_backward();
  }
  bool step_lost() const override { return shard_->step_lost(); }
  bool gathered_scope_open() const override { return gatherer_->pinned(); }
  double global_grad_norm() override;
  at::Tensor global_grad_norm_tensor() override;
  // Tensor parallelism (tp/tp_stage.h): defined in zero/grad_square_sums.cpp.
  at::Tensor grad_square_sums(const std::vector<at::Tensor>& selected) override;
  void step(double grad_scale) override;
  void discard_gradients() override;
  MemoryReport memory() const override;
  std::shared_ptr<torch::optim::Optimizer> optimizer() const override { return shard_->optimizer(); }
  void before_forward() override { gatherer_->begin_forward(); }
  // Checkpoints (stage3_checkpoint.cpp): this rank's slice of every unit, as parameter fragments.
  std::unique_ptr<FragmentState> state_to_save() override;
  std::unique_ptr<FragmentState> state_to_load(bool create_moments) override;
  int64_t adam_step() const override { return shard_->adam_step(); }
  void finish_load(int64_t adam_step) override;
  void refresh_masters_from_model() override;
  std::vector<StateFragment> fragments_of_rank(int rank, const std::vector<int64_t>& numels,
                                               int world_size) const override;
  std::function<void()> gather_for_access(
      const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
      std::optional<int> modifier_rank) override;
  // The module file, unit by unit: a managed parameter's group is its unit.
  int gather_group_of(const at::Tensor& param) const override;
  std::vector<int64_t> whole_shape(const at::Tensor& param) const override;
  std::function<void()> gather_group(int unit, std::optional<int> modifier_rank) override;

 private:
  // A run of one unit's flat buffer [begin, end), cut at parameter boundaries, whose gradients
  // are reduce-scattered together (reduce_bucket_size elements or one larger parameter).
  struct GradBucket {
    int unit = 0;
    int64_t begin = 0, end = 0;
    at::Tensor buffer;    // the bucket's gradients, in the wire dtype
    at::Tensor received;  // this rank's part of the sum
    comm::WorkPtr work;
  };
  void make_buckets();
  void refuse_units_of_an_ended_engine(torch::nn::Module& model);
  void partition_unit(int u);
  void on_grad_ready(int u, size_t i);
  // The launch order's position `position` (BucketOrder's bucket) is buckets_[size - 1 - position].
  void launch_position(size_t position) { launch(buckets_.size() - 1 - position); }
  void launch(size_t b);
  // At end_backward: units still waiting for a gradient that never came (warned once per unit).
  void warn_units_left_gathered();
  void finish(size_t b);
  void allocate(GradBucket& b);
  void recover_abandoned();

  // This rank's checkpoint fragments, with where they lie in its partition.
  std::vector<StateFragment> own_fragments() const;
  // Unpins `units`; with a modifier rank, its values become every rank's slices and masters.
  // `before`: with a modifier rank, each unit's own slice as the scope began (else empty).
  void release_units(const std::vector<int>& units, std::optional<int> modifier_rank,
                     const std::vector<at::Tensor>& before);
  // This rank's slice of `unit`'s gathered buffer (a view).
  at::Tensor own_slice(int unit);
  // This rank's slice of the partition at `offset` went from `before` to `after` (a modifier
  // rank's edits): the masters of the elements that changed follow.
  void write_edited_masters(int64_t offset, const at::Tensor& before, const at::Tensor& after);
  // (unit, index in the unit) of a managed parameter, or nullptr; built on first use.
  const std::pair<int, size_t>* slot_of(const at::Tensor& param) const;
  mutable std::unordered_map<const void*, std::pair<int, size_t>> slot_of_;

  StageContext ctx_;
  Stage3Options options_;
  ZeroPPOptions zeropp_;  // resolved against the world size
  QgzHops qgz_hops_;      // qgZ's two hops when the ranks span nodes (quantized_reduce.h)
  std::unordered_map<const void*, size_t> param_index_;  // TensorImpl -> index in `trainable`
  std::vector<ZeroUnitBase*> modules_;
  Stage3Layout layout_;
  at::ScalarType param_dtype_ = at::kFloat;
  at::ScalarType comm_dtype_ = at::kFloat;
  // this rank's slices of every unit, in the parameter dtype
  std::unique_ptr<offload::ParamStore> params_;
  bool boundary_ = false;  // this backward ends an accumulation: its reductions are final
  bool in_backward_ = false;  // between begin_backward and end_backward: still set, it threw
  bool recovering_ = false;   // finishing what a failed backward left in flight
  // this rank's averaged gradients, laid out as params_ (unit_gradients.h: in memory, or in a
  // file under offload_optimizer nvme); declared before shard_, whose update thread reads them,
  // so they are destroyed after
  std::unique_ptr<UnitGradients> grads_;
  std::vector<int> unit_buckets_;     // per unit: its buckets
  std::vector<int> unit_finished_;    // per unit: buckets reduced this micro-step
  std::unique_ptr<ShardOptimizer> shard_;  // fp32 masters and moments, wherever they live
  std::unique_ptr<UnitGatherer> gatherer_;
  std::vector<GradBucket> buckets_;
  std::vector<std::vector<size_t>> bucket_of_;  // [unit][parameter] -> index into buckets_
  std::vector<size_t> first_param_;     // per unit: its first parameter's index in order_
  std::unique_ptr<BucketOrder> order_;  // which buckets may go; refuses a second gradient
  std::vector<std::string> param_names_;  // by order_'s parameter index: the model's names
  std::vector<bool> warned_;              // per unit: told that it stayed gathered
  std::vector<int> unit_arrived_;         // per unit: parameters whose gradient arrived
  InFlight in_flight_{0};
  int64_t bucket_bytes_ = 0, peak_bucket_bytes_ = 0;
  GradientHooks hooks_;
};

}  // namespace zero
}  // namespace deepspeed
