// Activation checkpointing (DeepSpeed's deepspeed.checkpointing): run a segment of the model
// without keeping its intermediate activations, and run it again in backward to get them.
//
//     auto y = deepspeed::checkpointing::checkpoint(
//         [&](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{block->forward(in[0])}; },
//         {x})[0];
//
// Memory: only the segment's inputs are kept (in host memory with cpu_checkpointing on a GPU
// build); time: the segment's forward runs twice (DeepSpeed's rule of thumb: ~33% more compute
// when every block is checkpointed).
// Exactness: the recomputation runs with the random-number state the first run started with (the
// CPU generator, the generator of each GPU the inputs live on and, on a machine with a GPU, that of
// the current CUDA device), so dropout masks are identical, and under the first run's autocast
// settings (CPU and CUDA: enabled, dtype, cast cache), so it computes in the same precision even
// when backward runs outside the autocast region: the gradients are bit-identical to a run without
// checkpointing.
// The segment must be a function of its tensor inputs and of parameters it reaches itself (they get
// their gradients through the recomputation); outputs that do not require grad pass through.
// Inputs must not change in place, as with PyTorch's checkpoint: a segment that modifies one of its
// inputs in place throws deepspeed::Error when it returns (its recomputation would apply the change
// twice), and an input modified in place after the checkpoint, before backward reaches it, makes
// that backward throw deepspeed::Error naming the input ("modified by an inplace operation"); the
// same whether inputs are saved as they are, as host copies or as partitions.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "deepspeed/comm.h"
#include "deepspeed/config.h"

namespace deepspeed {
namespace checkpointing {

using Segment = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// Runs `segment(inputs)` under no_grad and returns its outputs joined to the autograd graph; the
// backward of those outputs re-runs the segment with grad enabled and back-propagates through it.
// Outside grad mode (evaluation) it is a plain call (and nothing above is checked).
std::vector<at::Tensor> checkpoint(const Segment& segment, const std::vector<at::Tensor>& inputs);
// One tensor in, one out.
at::Tensor checkpoint(const std::function<at::Tensor(const at::Tensor&)>& segment,
                      const at::Tensor& input);

// The activation_checkpointing config block's switches (deepspeed.checkpointing.configure); the
// meaning of each is documented at ActivationCheckpointingConfig (deepspeed/config.h):
// partition_activations splits saved inputs over the model-parallel group below (warns once when
// configured without one: checkpoints are then kept whole); cpu_checkpointing keeps saved
// inputs in pinned host memory on GPU builds; contiguous_memory_optimization needs
// number_checkpoints and caps the checkpoints one forward may hold (an error naming the key);
// synchronize_checkpoint_boundary synchronizes the GPU around each segment; profile times each
// segment's forward and recomputation (stats(), profile_summary()).
using Options = ActivationCheckpointingConfig;
// Process-wide, as DeepSpeed's module-level configure(). initialize() calls it with the config's
// activation_checkpointing block.
void configure(const Options& options);
Options options();

// The tensor-parallel group partition_activations splits saved inputs across (DeepSpeed's
// configure(mpu_)): with it, each floating-point input of a checkpoint that has at least
// group-size elements is kept as this rank's 1/N of its flattened values (the inputs are the
// replicated activations between tensor-parallel layers, the same on every rank of the group),
// and the whole input is all-gathered over the group before the recomputation in backward.
// Per thread: the group applies to checkpoints whose forward runs on the calling thread (a
// rank's training thread; dist tests run ranks as threads, each with its own group); a
// checkpoint keeps the group it was made with until its backward. initialize() and
// pipe::initialize_pipeline() set it from a topology whose tensor size is > 1; null or a group
// of one: checkpoints are kept whole. Forward and backward of a partitioned checkpoint are then
// COLLECTIVE over the group.
void set_model_parallel_group(comm::CommunicatorPtr group);
comm::CommunicatorPtr model_parallel_group();

// Counters of this process since the last reset_stats() (always counted; times only with profile).
struct Stats {
  int64_t forwards = 0;        // checkpointed segment forwards
  int64_t recomputes = 0;      // re-runs in backward
  int64_t saved_bytes = 0;     // bytes of inputs currently held for recomputation (this
                               // rank's partitions only, under partition_activations)
  int64_t peak_saved_bytes = 0;
  double forward_seconds = 0;
  double recompute_seconds = 0;
};
Stats stats();
void reset_stats();
// "activation checkpointing: N segments, forward X s, recompute Y s" (what profile prints).
std::string profile_summary();

}  // namespace checkpointing
}  // namespace deepspeed
