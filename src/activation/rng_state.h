// The random-number state a checkpointed segment started with, so its recomputation in backward
// draws the same numbers (dropout masks) as the first run.
#pragma once
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace deepspeed {
namespace checkpointing {

class RngState {
 public:
  // The CPU generator's state, and that of each CUDA device among `devices`.
  static RngState capture(const std::vector<c10::Device>& devices);
  // Sets every captured generator back to its captured state.
  void restore() const;

 private:
  std::vector<std::pair<c10::Device, at::Tensor>> states_;
};

// Restores `saved` for the scope and puts back the states found on entry when it ends (so the
// recomputation does not disturb the random numbers the rest of backward and later steps draw).
class RngStateScope {
 public:
  RngStateScope(const RngState& saved, const std::vector<c10::Device>& devices);
  ~RngStateScope();
  RngStateScope(const RngStateScope&) = delete;
  RngStateScope& operator=(const RngStateScope&) = delete;

 private:
  RngState entry_;
};

}  // namespace checkpointing
}  // namespace deepspeed
