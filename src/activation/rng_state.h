// The random-number state a checkpointed segment started with, so its recomputation in backward
// draws the same numbers (dropout masks) as the first run.
#pragma once
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace deepspeed {
namespace checkpointing {

// The state of `device`'s default generator (the CPU's, or a CUDA device's, which only a build and
// machine with a GPU have), read and set under the generator's lock: what a training checkpoint
// saves and restores per rank (src/runtime/checkpoint_save.cpp). A copy: later draws leave it be.
at::Tensor generator_state(const c10::Device& device);
void set_generator_state(const c10::Device& device, const at::Tensor& state);

class RngState {
 public:
  // The CPU generator's state, that of each CUDA device among `devices`, and that of the current
  // CUDA device when the process has a GPU (what DeepSpeed saves: a segment may move CPU inputs to
  // the GPU and draw there).
  static RngState capture(const std::vector<c10::Device>& devices);
  // Sets every captured generator back to its captured state.
  void restore() const;
  // The devices whose generators were captured.
  std::vector<c10::Device> devices() const;

  using States = std::vector<std::pair<c10::Device, at::Tensor>>;

 private:
  friend class RngStateScope;  // captures the entry states of exactly the saved devices
  States states_;
};

// Restores `saved` for the scope and puts back the states its generators had on entry when it ends
// (so the recomputation does not disturb the random numbers the rest of backward and later steps
// draw).
class RngStateScope {
 public:
  explicit RngStateScope(const RngState& saved);
  ~RngStateScope();
  RngStateScope(const RngStateScope&) = delete;
  RngStateScope& operator=(const RngStateScope&) = delete;

 private:
  RngState entry_;
};

}  // namespace checkpointing
}  // namespace deepspeed
