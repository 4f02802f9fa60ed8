// Where stage 3 puts each unit's reduced gradients, behind one interface so the stage does not
// branch on it (make_unit_gradients picks):
//   in memory  the GradPartition (zero/grad_partition.h: on the compute device, or ZeRO-Offload's
//              partition in host memory); at an accumulation boundary a unit's slice goes to the
//              offloaded update as soon as it is final (zero/step_during_backward.h)
//   swapped    offload_optimizer nvme: unit slices accumulated in host memory and written to a
//              file (offload/grad_store.h); the optimizer reads them back sub-group by sub-group
//   none       an engine without an optimizer (zero/no_optimizer_shard.h): backward is refused
#pragma once
#include <cstdint>
#include <memory>

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include "deepspeed/config.h"
#include "zero/shard_optimizer.h"
#include "zero/stage3/unit_layout.h"
#include "zero/stage_options.h"

namespace deepspeed {
namespace zero {

class UnitGradients {
 public:
  virtual ~UnitGradients() = default;
  virtual void begin_micro_step(bool boundary) = 0;
  // Elements [first, first + reduced.numel()) of this rank's slice of unit u += reduced (this
  // micro-step's averaged gradients, queued on the compute device's current stream).
  virtual void accumulate(int unit, int64_t first, const at::Tensor& reduced) = 0;
  // Every bucket of unit u has been accumulated in this micro-step.
  virtual void unit_complete(int unit) = 0;
  virtual void end_micro_step() = 0;
  // After a boundary's backward: the sum of squares of this rank's gradients, fp64 [1] on the
  // compute device.
  virtual at::Tensor squared_norm() = 0;
  // What the optimizer step reads (a tensor in memory, or a source reading the file).
  virtual ShardGrads for_step() = 0;
  // The gradients are dropped (after a step, or a discarded one).
  virtual void clear() = 0;

  // For the MemoryReport: the gradients' bytes (when swapped: the most resident at once),
  // whether they are in host memory, and the compute-device temporaries their transfers held at
  // most.
  virtual int64_t bytes() const = 0;
  virtual bool in_host_memory() const = 0;
  virtual int64_t device_temporary_bytes() const = 0;
  // The same in host memory (a pageable host partition's page-locked copies; the swapped
  // gradients count theirs in bytes()).
  virtual int64_t host_temporary_bytes() const { return 0; }
  // Bytes in a swap file (with the optimizer on NVMe), beside memory.
  virtual int64_t file_bytes() const { return 0; }
};

// None for a shard without an optimizer; swapped under offload_optimizer nvme (`options.home`),
// else in memory: in host memory when the shard's update reads them there; on the compute device
// freed after each step with `release_gradients` (zero_optimization.release_gradients,
// DeviceGradPartition). `shard` and `params` outlive the result's calls.
std::unique_ptr<UnitGradients> make_unit_gradients(const Stage3Layout& layout,
                                                   at::ScalarType dtype,
                                                   const ShardOptions& options,
                                                   const AioConfig& aio, c10::Device device,
                                                   ShardOptimizer& shard,
                                                   ParamPartition& params,
                                                   bool release_gradients = false);

}  // namespace zero
}  // namespace deepspeed
