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
  // On the device, not read (as the inner stage's): the engine reads it when the step needs it.
  at::Tensor global_grad_norm_tensor() override {
    const at::Tensor n = inner().global_grad_norm_tensor();
    at::Tensor twice = torch::zeros({1}, n.options()), twice_split = torch::zeros({1}, n.options());
    // (`n` is on the host where a 1-bit optimizer's vote made it: its squares go there.)
    for (auto& p : counted_twice_) twice += square(p).to(n.device());
    for (auto& p : counted_twice_split_) twice_split += square(p).to(n.device());
    if (tensor_ && tensor_->world_size() > 1 && !counted_twice_split_.empty())
      tensor_->all_reduce(twice_split)->wait();
    at::Tensor sq = n * n - twice - twice_split;
    if (pipe_->world_size() > 1) pipe_->all_reduce(sq)->wait();
    // An overflow anywhere (inf, or NaN from inf - inf above) becomes inf on every stage: the
    // engine skips the step on a non-finite norm (a clamp to 0 once turned fp16 overflows into
    // applied NaN steps). A negative is rounding of the tied subtraction.
    return at::where(sq.isfinite(), sq.clamp_min(0),
                     torch::full_like(sq, std::numeric_limits<double>::infinity()))
        .sqrt_();
  }
  double global_grad_norm() override {
    const double norm = global_grad_norm_tensor().item<double>();
    return std::isfinite(norm) ? norm : std::numeric_limits<double>::infinity();
  }

 private:
  // 0-dim (a CPU zero adds to a device tensor too).
  static at::Tensor square(const at::Tensor& p) {
    return p.grad().defined() ? p.grad().to(torch::kDouble).pow(2).sum()
                              : torch::zeros({}, torch::kDouble);
  }
  comm::CommunicatorPtr pipe_, tensor_;
  std::vector<at::Tensor> counted_twice_, counted_twice_split_;
};

}  // namespace pipe
}  // namespace deepspeed
