// What a ZeRO stage is built from, decided once in runtime/build_engine.cpp: the context every
// part allocates and communicates through, and one options struct per part (never a copy of the
// whole Config: a part sees only the keys that concern it, already parsed into types).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/TensorOptions.h>

#include "deepspeed/comm.h"
#include "deepspeed/config.h"
#include "zero/flat_groups.h"

namespace deepspeed {
namespace zero {

// Where a stage's tensors live and whom it talks to. Every allocation of the parts goes through
// options(): giving the context a CUDA device is what moves parameters, gradients and buckets
// onto the GPU.
struct StageContext {
  comm::CommunicatorPtr comm;  // the data-parallel group (Topology::data_parallel())
  c10::Device device = c10::kCPU;

  at::TensorOptions options(at::ScalarType dtype) const {
    return at::TensorOptions().dtype(dtype).device(device);
  }
  int rank() const { return comm->rank(); }
  int world_size() const { return comm->world_size(); }
};

// offload_optimizer.device / offload_param.device, parsed once (the config keeps the strings
// users wrote).
enum class OffloadDevice { kNone, kCpu, kNvme };
OffloadDevice offload_device(const OffloadConfig& config);

// How gradients are averaged over the data-parallel group (gradient_scaling.h) and cut into
// buckets (reduce_bucket_size elements) for the collectives.
struct ReductionOptions {
  int64_t bucket_numel = 500000000;  // zero_optimization.reduce_bucket_size (at least 1)
  bool overlap = false;              // zero_optimization.overlap_comm (resolved default)
  std::string comm_dtype;            // communication_data_type: "", "fp32", "fp16", "bf16"
  bool prescale = false;             // prescale_gradients
  double predivide_factor = 1.0;     // gradient_predivide_factor
  // Stages 0/1 finish their all-reduces as they go (at most kMaxBucketsInFlight outstanding)
  // instead of at the end of backward: set when the offloaded update runs during backward, which
  // starts on a bucket only once it is finished.
  bool finish_buckets_early = false;
  // zero_optimization.release_gradients: the gradient partition on the compute device is freed
  // after each step (unset: on a GPU). releases_gradients() resolves it for a device.
  std::optional<bool> release_gradients;
};
bool releases_gradients(const ReductionOptions& options, c10::Device device);

// Where the shard optimizer keeps the fp32 masters and moments (zero/shard_optimizer.h).
struct ShardOptions {
  OffloadDevice home = OffloadDevice::kNone;  // offload_optimizer.device
  std::string nvme_path;                      // offload_optimizer.nvme_path
  int64_t buffer_count = 4;                   // offload_optimizer.buffer_count
  // offload_optimizer.pin_memory: host buffers of a GPU engine page-locked (copies at full
  // speed and asynchronous); false: pageable, as DeepSpeed (copies synchronous, slower).
  bool pin_memory = false;
  int64_t sub_group_size = 1000000000;        // zero_optimization.sub_group_size
  AioConfig aio;
  // The update may run during backward (zero/step_during_backward.h): the step will not scale
  // the gradients (no gradient_clipping, no fp16 loss scale) nor skip (no overflow vote: fp16,
  // bf16.check_grad_overflow; precision/overflow_vote.h).
  bool overlap_step_allowed = false;
  // offload_optimizer.overlap_step: unset = on when the stage computes on a GPU; true also on
  // the CPU; false off.
  std::optional<bool> overlap_step;
  // offload_optimizer.overlap_forward: the update's last ranges run on into the next forward
  // (zero/forward_waits.h). The stage clears it where it cannot apply (see FlatStage).
  bool overlap_forward = false;
  // fp16.fp16_master_weights_and_grads / bf16.bf16_master_weights_and_grads: the key that asked
  // for the masters in the model's 16-bit dtype instead of fp32 (the partition itself where it is
  // in memory: no copy at all), or empty. Only FusedAdam (Adam/AdamW) updates them.
  std::string low_precision_masters;
  // bf16.bf16_optimizer_states: with 16-bit masters, Adam's moments in bf16 (else fp32).
  bool bf16_moments = false;
  c10::Device compute_device = c10::kCPU;  // set by the stage: its context's device
  // Set by the stage: it reduces each bucket into a gradient partition (stages 2 and 3), which
  // the shard's gradients_in_host_memory() puts in host memory, with a fence per range even when
  // pageable (zero/host_grad_partition.h). False: the gradients stay on the compute device until
  // the shard brings them down (a stage 1 that all-reduces a full buffer).
  bool reduces_into_partition = false;
  // Set by stage 3: with the optimizer on NVMe its gradients are swapped too and reach the update
  // from host memory (offload/grad_store.h), never from the compute device, so the swapped
  // optimizer keeps no landing buffer for device gradients.
  bool gradients_from_host = false;
  // A client optimizer with several parameter groups (zero/flat_groups.h), set by the builder:
  // group_of[k] is trainable parameter k's group (empty: one group, the whole partition).
  std::vector<int> group_of;
  int group_count = 1;
  // Set by the stage from group_of and its fragments: the partition cut by group.
  std::vector<GroupSegment> group_segments;
};

// Stages 0 (16-bit), 1 and 2 over one flat buffer (zero/flat_stage.h).
struct FlatStageOptions {
  at::ScalarType param_dtype = at::kFloat;  // every trainable parameter's (checked by the builder)
  // true: each rank owns 1/N of the buffer (stages 1, 2); false: one partition spanning the
  // buffer, the same on every rank (stage 0 in 16 bits).
  bool partitioned = true;
  // true: reduce-scatter into a gradient partition (stages 1 and 2); false: all-reduce a full
  // gradient buffer at the accumulation boundary (stage 0; stage 1 where whole gradients are
  // needed: see runtime/build_engine.cpp).
  bool scatter_gradients = false;
  // With scatter_gradients: true, every micro-step is reduced into the partition (stage 2);
  // false, only the accumulation boundary's (stage 1): the micro-steps before it accumulate in
  // the parameters' .grad, as autograd leaves them, and the boundary's backward reduces the sum
  // (DeepSpeed's stage 1, which reduces only at the boundary).
  bool scatter_every_micro_step = true;
  // Where the micro-steps accumulate ("" = the parameters' dtype): stage 2's gradient partition,
  // stages 0/1's full gradient buffer (build_engine.cpp resolves DeepSpeed's default).
  std::string grad_accum_dtype;
  int64_t accumulation_steps = 1;  // gradient_accumulation_steps
  int64_t allgather_bucket_numel = 500000000;  // zero_optimization.allgather_bucket_size
  // zero_optimization.overlap_param_gather (partitioned, with peers): step() launches the
  // all-gather of the updated partitions and the next forward waits for it part by part
  // (zero/param_gather.h, zero/forward_waits.h).
  bool overlap_param_gather = false;
  ReductionOptions reduction;
  ShardOptions shard;
};

// Stage 3 (zero/stage3/stage3.h): its units, gatherer and parameter store read the
// zero_optimization keys they document.
struct Stage3Options {
  at::ScalarType param_dtype = at::kFloat;  // every trainable parameter's (checked by the builder)
  std::string grad_accum_dtype;  // the gradient partition's dtype ("" = the parameters')
  ZeroConfig zero;
  AioConfig aio;
  ReductionOptions reduction;
  ShardOptions shard;
};

// Stage 0 in fp32 (zero/data_parallel.h): the optimizer steps the module's own parameters.
struct DataParallelOptions {
  ReductionOptions reduction;
};

// The parts' options from a parsed config.
ReductionOptions reduction_options(const Config& config);
ShardOptions shard_options(const Config& config);

}  // namespace zero
}  // namespace deepspeed
