// A ZeroStage seen across the pipeline: the stage's own ZeRO stage (over its data-parallel
// group) with the gradient norm summed over every pipeline stage, so clipping and the fp16
// overflow vote are global as without the pipeline. A tied parameter held by several stages is
// counted once (by its lowest holder); with tensor parallelism inside the stage, split parameters
// once over the tensor group (the inner stage's count) and replicated ones once. Everything else
// is the inner stage's.
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
  // `tensor`, `split`: with tensor parallelism inside the stage (inner then counts the norm over
  // the tensor group, tp/tp_stage.h), the group and its split parameters: a tied parameter that
  // is split is subtracted summed over the group, as inner counted it.
  PipeStage(std::unique_ptr<zero::ZeroStage> inner, comm::CommunicatorPtr pipe,
            std::vector<at::Tensor> counted_twice, comm::CommunicatorPtr tensor = nullptr,
            const std::vector<at::Tensor>& split = {})
      : ForwardingStage(std::move(inner)), pipe_(std::move(pipe)), tensor_(std::move(tensor)) {
    for (auto& p : counted_twice) {
      bool is_split = false;
      for (auto& s : split) is_split = is_split || s.is_same(p);
      (is_split ? counted_twice_split_ : counted_twice_).push_back(p);
    }
  }

  // COLLECTIVE over the data-parallel group, the tensor group (when given) and the pipe group:
  //   norm^2 = sum over stages of (this stage's norm^2 over data and tensor ranks
  //                                - its tied parameters another stage counts)
  double global_grad_norm() override {
    const double n = inner().global_grad_norm();
    double twice = 0.0, twice_split = 0.0;
    for (auto& p : counted_twice_) twice += square(p);
    for (auto& p : counted_twice_split_) twice_split += square(p);
    if (tensor_ && tensor_->world_size() > 1 && !counted_twice_split_.empty()) {
      at::Tensor t = torch::full({1}, twice_split, torch::kDouble);
      tensor_->all_reduce(t)->wait();
      twice_split = t.item<double>();
    }
    double sq = n * n - twice - twice_split;
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
  static double square(const at::Tensor& p) {
    return p.grad().defined() ? p.grad().to(torch::kDouble).pow(2).sum().item<double>() : 0.0;
  }
  comm::CommunicatorPtr pipe_, tensor_;
  std::vector<at::Tensor> counted_twice_, counted_twice_split_;
};

}  // namespace pipe
}  // namespace deepspeed
