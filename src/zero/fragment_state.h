// The two ways a stage hands its checkpoint state out as a FragmentState (stage.h):
//   - over a shard optimizer's windows: each fragment knows where it lies in the partition
//     (StateFragment::at) and is cut where the windows are cut (stages 0 in 16 bits, 1, 2, 3);
//   - over views into live tensors, one piece per fragment (stage 0 in fp32, whose optimizer
//     state is keyed on the module's own parameters).
#pragma once
#include <memory>
#include <vector>

#include "zero/shard_optimizer.h"
#include "zero/stage.h"

namespace deepspeed {
namespace zero {

// REQUIRES: each fragment's [at, at + numel) lies inside the windows' partition.
std::unique_ptr<FragmentState> windowed_fragment_state(std::vector<StateFragment> fragments,
                                                       std::unique_ptr<StateWindows> windows);

// REQUIRES: every fragment's master (and moments, when defined) are views of numel elements.
std::unique_ptr<FragmentState> view_fragment_state(std::vector<StateFragment> fragments);

}  // namespace zero
}  // namespace deepspeed
