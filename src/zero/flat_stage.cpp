#include "zero/flat_stage.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <unordered_map>

#include "optim/lamb.h"
#include "partition/partition.h"
#include "zero/fragment_state.h"
#include "zero/single_rank_gradients.h"
#include "zero/tensor_facts.h"

namespace deepspeed {
namespace zero {
namespace {

// Elements of each partition per all-gather: allgather_bucket_size over the ranks. Overlapping
// the next forward, also at most a sixteenth of the partition (at least 2^16 elements), so the
// forward's first layers wait for their chunk, not for the whole gather.
int64_t gather_chunk_numel(const FlatStageOptions& options, int64_t partition_numel, int world) {
  int64_t chunk = options.allgather_bucket_numel / world;
  if (options.overlap_param_gather)
    chunk = std::min(chunk, std::max<int64_t>(int64_t{1} << 16, (partition_numel + 15) / 16));
  return std::max<int64_t>(1, chunk);
}

}  // namespace

FlatStage::FlatStage(std::vector<at::Tensor> params, const StageContext& context,
                     const FlatStageOptions& options, const OptimizerFactory& make_optimizer,
                     torch::nn::Module* model)
    : ctx_(context) {
  const int parts = options.partitioned ? ctx_.world_size() : 1;
  flat_ = std::make_unique<FlatParams>(params, parts, partition::kAlignment, ctx_.device);
  ownership_ = options.partitioned
                   ? make_sharded_ownership(
                         ctx_, *flat_,
                         gather_chunk_numel(options, flat_->layout().partition_numel, parts))
                   : make_replicated_ownership(ctx_);
  // With one rank nothing is gathered.
  if (options.overlap_param_gather && parts > 1)
    overlapped_gather_ = ownership_->updates_in_flight();
  partition_ = std::make_unique<TensorPartition>(flat_->partition(ownership_->owner()).detach());
  ShardOptions shard = options.shard;
  shard.compute_device = ctx_.device;
  shard.reduces_into_partition = options.scatter_gradients;
  // With peers the updated partitions are all-gathered at the step: nothing can run on.
  shard.overlap_forward = shard.overlap_forward && options.partitioned && ctx_.world_size() == 1;
  if (!shard.group_of.empty())
    shard.group_segments = group_segments(ownership_->fragments_to_load(*flat_), shard.group_of,
                                          partition_->numel());
  shard_ = make_shard_optimizer(shard, *partition_, make_optimizer);
  const ReductionOptions reduction = reduction_for(options.reduction);
  const auto comm_dtype = dtype_from_config(reduction.comm_dtype, options.param_dtype);
  if (options.scatter_gradients) {
    // Autograd accumulates in the parameter dtype; the scattered partition may be wider.
    const auto grad_dtype = dtype_from_config(options.grad_accum_dtype, options.param_dtype);
    // A rank alone in its data-parallel group has nothing to reduce: its gradients go straight
    // into the partition, with no bucket (single_rank_gradients.h). A host partition keeps its
    // buckets: each is one download that the offloaded update takes during backward.
    if (ctx_.world_size() == 1 && !shard_->gradients_in_host_memory())
      grads_ = std::make_unique<SingleRankGradients>(ctx_, *flat_, reduction, comm_dtype,
                                                     grad_dtype);
    else
      grads_ = std::make_unique<ReduceScatterBuckets>(
          ctx_, *flat_, reduction, comm_dtype, grad_dtype, shard_->gradients_in_host_memory(),
          options.shard.pin_memory);
    if (!options.scatter_every_micro_step) {
      grads_->reduce_at_boundary_only();
      // Between the micro-steps of an accumulation autograd holds every gradient in .grad.
      if (options.accumulation_steps > 1)
        for (const auto& slot : flat_->slots())
          accumulating_grad_bytes_ += slot.numel * c10::elementSize(options.param_dtype);
    }
  } else {
    // Stages 0/1: the full buffer accumulates the micro-steps, in grad_accum_dtype. One
    // micro-step sums nothing (its gradients widened and narrowed again are the same values), so
    // without accumulation the buffer stays in the parameters' dtype, unless the gradients also
    // travel wider (the wider buffer then keeps the sum's precision).
    const bool wider_matters =
        options.accumulation_steps > 1 || comm_dtype != options.param_dtype;
    const auto grad_dtype = wider_matters
                                ? dtype_from_config(options.grad_accum_dtype, options.param_dtype)
                                : options.param_dtype;
    grads_ = std::make_unique<AllReduceBuckets>(ctx_, *flat_, ownership_->owner(), reduction,
                                                comm_dtype, grad_dtype);
  }
  if (shard_->steps_during_backward())
    grads_->on_final([this](int64_t begin, int64_t numel, std::shared_ptr<device::CopyFence> ready) {
      shard_->gradients_final(begin, grads_->partition().narrow(0, begin, numel), *partition_,
                              std::move(ready));
    });
  if (overlapped_gather_ && model) {
    forward_waits_ = std::make_unique<ForwardWaits>(*model, *flat_, 0, flat_->buffer().numel(),
                                                    *overlapped_gather_,
                                                    "zero_optimization.overlap_param_gather");
    overlapped_gather_->set_forward_order([waits = forward_waits_.get()](int64_t begin,
                                                                         int64_t end) {
      return waits->first_read(begin, end);
    });
  }
  if (shard_->finishes_in_forward() && model) {  // one rank: never with the gather's waits
    forward_waits_ = std::make_unique<ForwardWaits>(
        *model, *flat_, flat_->layout().begin(ownership_->owner()), partition_->numel(), *shard_,
        "zero_optimization.offload_optimizer.overlap_forward");
    shard_->set_forward_order(
        [waits = forward_waits_.get()](int64_t begin, int64_t end) {
          return waits->first_read(begin, end);
        });
  }
  const auto order = slots_in_param_order(params);
  if (auto* lamb = dynamic_cast<optim::Lamb*>(shard_->optimizer().get()))
    tell_lamb_fragments(*lamb, order);
  if (auto* onebit = dynamic_cast<optim::SelfCommunicatingOptimizer*>(shard_->optimizer().get()))
    tell_segments(*onebit, order);
}

// ZeRO-Offload's update during backward starts on a range when its bucket is reduced, so the
// bucket size sets how much update is left after backward: with DeepSpeed's usual
// reduce_bucket_size (5e8) a 1.3B model has 3 buckets, and a third of the update would follow
// backward. A single rank reduces nothing, so its buckets cost nothing to cut finer: there they
// are at most 1/32 of the buffer (at least 2^16 elements). With peers, reduce_bucket_size is the
// user's trade between message size and overlap, and stays as configured. Stages 0/1 (whose
// in-place all-reduces are otherwise all finished at the end of backward) finish them as they go.
ReductionOptions FlatStage::reduction_for(ReductionOptions reduction) const {
  if (!shard_->steps_during_backward()) return reduction;
  reduction.finish_buckets_early = true;  // stages 0/1: else every bucket finishes at the end
  if (ctx_.world_size() != 1) return reduction;
  const int64_t finer = std::max<int64_t>(int64_t{1} << 16, (flat_->buffer().numel() + 31) / 32);
  reduction.bucket_numel = std::min(reduction.bucket_numel, finer);
  return reduction;
}

// The slots (FlatParams) in the order of the parameters the stage was given: FlatParams lays them
// out in reverse, as backward produces their gradients, but what the optimizers keep per
// parameter (Lamb's trust ratios, the 1-bit optimizers' segments, ratios, fresh variance and
// error feedback, all of which checkpoints save) is in the model's order, as the fp32 stage
// keeps it: a checkpoint then loads in either precision.
std::vector<size_t> FlatStage::slots_in_param_order(const std::vector<at::Tensor>& params) const {
  const auto& slots = flat_->slots();
  std::unordered_map<const c10::TensorImpl*, size_t> slot_of;
  for (size_t k = 0; k < slots.size(); ++k) slot_of[slots[k].param.unsafeGetTensorImpl()] = k;
  std::vector<size_t> order;
  for (const auto& p : params)
    if (auto it = slot_of.find(p.unsafeGetTensorImpl()); it != slot_of.end())
      order.push_back(it->second);
  TORCH_CHECK(order.size() == slots.size(), "FlatStage: ", order.size(), " of ", slots.size(),
              " flat slots match the stage's parameters");
  return order;
}

// A 1-bit optimizer compresses each parameter's part of the flat master with its own scales
// (optim/self_communicating.h). Only unpartitioned (stage 0): the config refuses them with ZeRO.
void FlatStage::tell_segments(optim::SelfCommunicatingOptimizer& onebit,
                              const std::vector<size_t>& order) {
  TORCH_CHECK(ownership_->parts() == 1,
              "FlatStage: a 1-bit optimizer over partitioned (ZeRO >= 1) masters; the config "
              "should have refused it");
  std::vector<at::Tensor> params;
  std::vector<std::pair<int64_t, int64_t>> segments;
  for (size_t k : order) {
    const auto& slot = flat_->slots()[k];
    params.push_back(slot.param);
    segments.emplace_back(slot.offset, slot.numel);
  }
  onebit.set_segments(std::move(params), std::move(segments));
  self_comm_ = &onebit;
}

// Lamb's trust ratio is per parameter, but this rank's partition holds fragments of parameters:
// Lamb sums its fragments' squared norms and sum_over_owners adds the other ranks' (one
// all-reduce of 2 × parameters doubles per step; replicated stage 0 holds every parameter whole
// and adds nothing). optim/lamb.h has the arithmetic. Fragment i belongs to parameter i.
void FlatStage::tell_lamb_fragments(optim::Lamb& lamb, const std::vector<size_t>& order) {
  const auto& layout = flat_->layout();
  const int64_t begin = layout.begin(ownership_->owner()), end = begin + layout.partition_numel;
  std::vector<optim::Lamb::Fragment> fragments;
  const auto& slots = flat_->slots();
  for (size_t i = 0; i < order.size(); ++i) {
    const auto& slot = slots[order[i]];
    const int64_t lo = std::max(begin, slot.offset);
    const int64_t hi = std::min(end, slot.offset + slot.numel);
    if (lo < hi) fragments.push_back({static_cast<int64_t>(i), lo - begin, hi - lo});
  }
  lamb.set_fragments(std::move(fragments), static_cast<int64_t>(slots.size()),
                     [this](at::Tensor& squares) { ownership_->sum_over_owners(squares); });
}

// An inf or NaN in any rank's gradients makes the summed square non-finite on every rank, so this
// one all-reduce is also the overflow vote. Replicated (stage 0) the all-reduce of the gradients
// already spread it, except when a 1-bit optimizer kept them local: then the norm is this rank's
// own (as DeepSpeed's 1-bit Adam clips with it) and a one-element all-reduce counts the ranks
// that overflowed, so that all skip the step together (DeepSpeed's CheckOverflow all-reduces its
// overflow flag over the data-parallel group when enable_backward_allreduce is off). Without
// the vote the ranks would step different optimizers, and the loss scales would part.
at::Tensor FlatStage::global_grad_norm_tensor() {
  if (gradients_stay_local() && ctx_.world_size() > 1) return ZeroStage::global_grad_norm_tensor();
  at::Tensor sq = grads_->squared_norm();
  ownership_->sum_over_owners(sq);
  return sq.sqrt_();
}

double FlatStage::global_grad_norm() {
  if (!gradients_stay_local() || ctx_.world_size() == 1)
    return global_grad_norm_tensor().item<double>();
  at::Tensor sq = grads_->squared_norm();
  ownership_->sum_over_owners(sq);
  return agreed_across_data_ranks(sq.sqrt_()).item<double>();
}

// The vote: the number of ranks whose norm is not finite, summed; any makes every rank's NaN.
at::Tensor FlatStage::agreed_across_data_ranks(at::Tensor norm) {
  if (!gradients_stay_local() || ctx_.world_size() == 1) return norm;
  at::Tensor overflowed = norm.isfinite().logical_not().to(torch::kDouble);
  ctx_.comm->all_reduce(overflowed)->wait();
  return at::where(overflowed > 0,
                   torch::full_like(norm, std::numeric_limits<double>::quiet_NaN()), norm);
}

void FlatStage::step(double grad_scale) {
  complete_step();  // a step with no backward since the last one
  grads_->settle();
  shard_->step({grads_->partition()}, *partition_, grad_scale);
  // Nothing at one rank, the only place the shard hands its update over.
  if (overlapped_gather_)
    ownership_->start_sharing_updates(*flat_);
  else
    ownership_->share_updates(*flat_);
  if (shard_->finishes_in_forward())
    zero_after_update_ = true;
  else
    grads_->zero();
}

void FlatStage::complete_step() {
  shard_->complete_step();
  if (overlapped_gather_) overlapped_gather_->complete_step();
  if (!zero_after_update_) return;
  zero_after_update_ = false;
  grads_->zero();
}

bool FlatStage::step_handed_over() const {
  return shard_->step_handed_over() ||
         (overlapped_gather_ && overlapped_gather_->in_flight());
}

void FlatStage::before_forward() {
  if (!shard_->finishes_in_forward() && !step_handed_over()) return;
  if (forward_waits_)
    forward_waits_->before_forward();
  else
    complete_step();
}

MemoryReport FlatStage::memory() const {
  MemoryReport r;
  r.parameters = storage_bytes(flat_->buffer());
  r.gradients = grads_->gradient_bytes() + accumulating_grad_bytes_;
  r.optimizer_states = shard_->resident_bytes();
  r.comm_buffers = grads_->comm_buffer_bytes();
  r.host_comm_buffers = grads_->host_comm_buffer_bytes();
  // The accumulating .grad are on the compute device, even where the partition is in host memory.
  const int64_t partition = grads_->gradient_bytes();
  r.host_bytes = host_share(ctx_.device, r.parameters + r.comm_buffers + accumulating_grad_bytes_) +
                 (ctx_.device.is_cpu() ? 0 : r.host_comm_buffers) +
                 (grads_->gradients_on_host() ? partition : host_share(ctx_.device, partition)) +
                 shard_->resident_host_bytes();
  r.nvme_bytes = shard_->file_bytes();
  return r;
}

std::unique_ptr<FragmentState> FlatStage::state_to_save() {
  return windowed_fragment_state(ownership_->fragments_to_save(*flat_), shard_->windows_for_save());
}

std::unique_ptr<FragmentState> FlatStage::state_to_load(bool create_moments) {
  return windowed_fragment_state(ownership_->fragments_to_load(*flat_),
                                 shard_->windows_for_load(create_moments));
}

// The loaded masters -> this rank's (16-bit) partition -> every rank.
void FlatStage::finish_load(int64_t adam_step) {
  complete_step();
  shard_->finish_load(adam_step, *partition_);
  ownership_->share_updates(*flat_);
}

}  // namespace zero
}  // namespace deepspeed
