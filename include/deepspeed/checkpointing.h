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
// Exactness: the recomputation runs with the random-number state the first run started with (CPU
// generator, and the current CUDA device's on CUDA builds), so dropout masks are identical and the
// gradients are bit-identical to a run without checkpointing.
// The segment must be a function of its tensor inputs and of parameters it reaches itself (they get
// their gradients through the recomputation); outputs that do not require grad pass through.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "deepspeed/config.h"

namespace deepspeed {
namespace checkpointing {

using Segment = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// Runs `segment(inputs)` under no_grad and returns its outputs joined to the autograd graph; the
// backward of those outputs re-runs the segment with grad enabled and back-propagates through it.
// Outside grad mode (evaluation) it is a plain call.
std::vector<at::Tensor> checkpoint(const Segment& segment, const std::vector<at::Tensor>& inputs);
// One tensor in, one out.
at::Tensor checkpoint(const std::function<at::Tensor(const at::Tensor&)>& segment,
                      const at::Tensor& input);

// The activation_checkpointing config block's switches (deepspeed.checkpointing.configure); the
// meaning of each is documented at ActivationCheckpointingConfig (deepspeed/config.h):
// partition_activations warns once (no tensor-parallel group yet); cpu_checkpointing keeps saved
// inputs in pinned host memory on GPU builds; contiguous_memory_optimization needs
// number_checkpoints and caps the checkpoints one forward may hold (an error naming the key);
// synchronize_checkpoint_boundary synchronizes the GPU around each segment; profile times each
// segment's forward and recomputation (stats(), profile_summary()).
using Options = ActivationCheckpointingConfig;
// Process-wide, as DeepSpeed's module-level configure(). initialize() calls it with the config's
// activation_checkpointing block.
void configure(const Options& options);
Options options();

// Counters of this process since the last reset_stats() (always counted; times only with profile).
struct Stats {
  int64_t forwards = 0;        // checkpointed segment forwards
  int64_t recomputes = 0;      // re-runs in backward
  int64_t saved_bytes = 0;     // bytes of inputs currently held for recomputation
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
