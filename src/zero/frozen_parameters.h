// Frozen parameters (requires_grad false) belong to no ZeRO stage: every stage is built over the
// trainable parameters, and the frozen ones stay in the module as it holds them, whole at every
// stage (stage 3 included). This wrapper adds their bytes to the stage's memory report, so that
// MemoryReport::parameters is every parameter the rank holds (deepspeed/memory.h).
#pragma once
#include <memory>
#include <vector>

#include "zero/forwarding_stage.h"

namespace deepspeed {
namespace zero {

class FrozenParametersStage : public ForwardingStage {
 public:
  // `frozen`: the module's parameters no stage holds (each once; tied aliases left out).
  FrozenParametersStage(std::unique_ptr<ZeroStage> inner, std::vector<at::Tensor> frozen)
      : ForwardingStage(std::move(inner)), frozen_(std::move(frozen)) {}
  // The inner stage's report, with the frozen parameters' storages (each storage once) in
  // `parameters` and, for those in host memory, in host_bytes.
  MemoryReport memory() const override;

 private:
  std::vector<at::Tensor> frozen_;
};

// `inner` itself when `frozen` is empty (nothing to add), else wrapped.
std::unique_ptr<ZeroStage> counting_frozen_parameters(std::unique_ptr<ZeroStage> inner,
                                                      std::vector<at::Tensor> frozen);

}  // namespace zero
}  // namespace deepspeed
