// A ZeroStage seen across the pipeline: the stage's own ZeRO stage (over its data-parallel
// group) with the gradient norm summed over every pipeline stage, so clipping and the fp16
// overflow vote are global as without the pipeline. A tied parameter held by several stages is
// counted once (by its lowest holder). Everything else is the inner stage's.
#pragma once
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "deepspeed/comm.h"
#include "zero/forwarding_stage.h"

namespace deepspeed {
namespace pipe {

class PipeStage : public zero::ForwardingStage {
 public:
  // `counted_twice`: tied parameters whose (full, reduced) gradient another stage counts too.
  PipeStage(std::unique_ptr<zero::ZeroStage> inner, comm::CommunicatorPtr pipe,
            std::vector<at::Tensor> counted_twice)
      : ForwardingStage(std::move(inner)), pipe_(std::move(pipe)),
        counted_twice_(std::move(counted_twice)) {}

  // COLLECTIVE over the data-parallel group and then the pipe group.
  double global_grad_norm() override {
    const double n = inner().global_grad_norm();
    double sq = n * n;
    for (auto& p : counted_twice_)
      if (p.grad().defined()) sq -= p.grad().to(torch::kDouble).pow(2).sum().item<double>();
    if (pipe_->world_size() > 1) {
      at::Tensor t = torch::full({1}, sq, torch::kDouble);
      pipe_->all_reduce(t)->wait();
      sq = t.item<double>();
    }
    // An overflow anywhere (inf, or NaN from inf - inf above) must stay non-finite on every
    // stage: the engine skips the step on a non-finite norm. (std::max(0.0, NaN) is 0.0, which
    // once turned fp16 overflows into applied NaN steps.)
    if (!std::isfinite(sq)) return std::numeric_limits<double>::infinity();
    return std::sqrt(std::max(0.0, sq));  // >= 0 up to rounding of the tied subtraction
  }

 private:
  comm::CommunicatorPtr pipe_;
  std::vector<at::Tensor> counted_twice_;
};

}  // namespace pipe
}  // namespace deepspeed
