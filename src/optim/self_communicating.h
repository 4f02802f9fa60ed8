// The seam between the 1-bit optimizers and ZeRO stage 0's gradient reduction.
//
// 1-bit Adam (after freeze_step) and 0/1 Adam exchange their own compressed momentum instead of
// the gradients. While gradients_stay_local() is true, the stage must leave each rank's
// gradients as its own backward produced them — no all-reduce, no averaging — and the optimizer
// averages across ranks itself (DeepSpeed: the optimizer sets engine.enable_backward_allreduce =
// False). zero/data_parallel.cpp (fp32) and zero/flat_stage.cpp (16 bits) ask before every
// boundary backward.
//
// Segments: in 16 bits the optimizer steps one flat fp32 master holding every parameter
// (zero/flat_stage.h). Compressed as one tensor it would get one scale for the whole model, and
// the parameters whose momentum is small next to the rest (biases, norms) would receive steps
// sized by the largest ones. The stage therefore names each parameter's [offset, offset + numel)
// in the master, and exchange_views() hands the compressor one view per parameter: each keeps its
// own scales, as in fp32. (DeepSpeed's FP16_Optimizer gives its 1-bit Adam the flat group, one
// scale; its 1-bit Lamb evens the sizes out with scaling_coeff for the same reason.)
#pragma once
#include <ATen/ATen.h>

#include <utility>
#include <vector>

namespace deepspeed {
namespace optim {

class SelfCommunicatingOptimizer {
 public:
  virtual ~SelfCommunicatingOptimizer() = default;
  // Whether the coming step() wants local gradients. Identical on every rank. Local.
  virtual bool gradients_stay_local() const = 0;

  // `params[i]` (a model parameter, for set_exp_avg_mask) lies at
  // [offset_and_numel[i].first, + .second) of the master.
  // REQUIRES: the optimizer has one parameter (the flat master), the segments lie inside it, and
  // no compressed exchange has run yet (the error-feedback buffers are laid out from them).
  void set_segments(std::vector<at::Tensor> params,
                    std::vector<std::pair<int64_t, int64_t>> offset_and_numel) {
    TORCH_CHECK(params.size() == offset_and_numel.size(), "set_segments: ", params.size(),
                " parameters for ", offset_and_numel.size(), " segments");
    segment_params_ = std::move(params);
    segments_ = std::move(offset_and_numel);
  }
  // The model parameters of the segments, in order (empty without segments).
  const std::vector<at::Tensor>& segment_params() const { return segment_params_; }

 protected:
  // What the compressed all-reduce gets for these per-parameter tensors (momenta, gradients,
  // local updates): the tensors themselves, or with segments one contiguous view per segment of
  // the single tensor (writes through).
  std::vector<at::Tensor> exchange_views(const std::vector<at::Tensor>& tensors) const {
    if (segments_.empty()) return tensors;
    TORCH_CHECK(tensors.size() == 1, "1-bit optimizer with segments: ", tensors.size(),
                " tensors, expected the one flat master");
    std::vector<at::Tensor> views;
    const at::Tensor flat = tensors[0].view({-1});
    for (const auto& [offset, numel] : segments_) views.push_back(flat.narrow(0, offset, numel));
    return views;
  }

 private:
  std::vector<at::Tensor> segment_params_;
  std::vector<std::pair<int64_t, int64_t>> segments_;
};

}  // namespace optim
}  // namespace deepspeed
