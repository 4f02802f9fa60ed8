#include "tp/tp_stage.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "zero/forwarding_stage.h"

namespace deepspeed {
namespace tp {
namespace {

class TensorParallelStage : public zero::ForwardingStage {
 public:
  TensorParallelStage(std::unique_ptr<zero::ZeroStage> inner, comm::CommunicatorPtr group,
                      std::vector<at::Tensor> split)
      : ForwardingStage(std::move(inner)), group_(std::move(group)), split_(std::move(split)) {}

  // COLLECTIVE over the data-parallel group, then the tensor-parallel group (and the
  // data-parallel group again where its ranks' gradients stay local: the inner stage's overflow
  // vote). On the device, not read: the engine reads it only when the step needs it (clipping,
  // fp16's overflow vote). A non-finite square anywhere (NaN too) is inf on every rank, as
  // global_grad_norm() and the pipeline's norm say: the overflow vote, and a clip coefficient
  // of 0 rather than NaN.
  at::Tensor global_grad_norm_tensor() override {
    const at::Tensor sums = inner().grad_square_sums(split_);
    at::Tensor split_sq = sums.narrow(0, 0, 1).clone();
    if (group_->world_size() > 1) group_->all_reduce(split_sq)->wait();
    split_sq.add_(sums.narrow(0, 1, 1));
    const at::Tensor norm = inner().agreed_across_data_ranks(split_sq.sqrt_());
    return at::where(norm.isfinite(), norm,
                     torch::full_like(norm, std::numeric_limits<double>::infinity()));
  }
  double global_grad_norm() override {
    const double norm = global_grad_norm_tensor().item<double>();
    return std::isfinite(norm) ? norm : std::numeric_limits<double>::infinity();
  }

 private:
  comm::CommunicatorPtr group_;
  std::vector<at::Tensor> split_;
};

}  // namespace

std::unique_ptr<zero::ZeroStage> tensor_parallel_stage(std::unique_ptr<zero::ZeroStage> inner,
                                                       comm::CommunicatorPtr tensor_group,
                                                       std::vector<at::Tensor> split) {
  return std::make_unique<TensorParallelStage>(std::move(inner), std::move(tensor_group),
                                               std::move(split));
}

}  // namespace tp
}  // namespace deepspeed
