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

  // COLLECTIVE over the data-parallel group, then the tensor-parallel group.
  double global_grad_norm() override {
    const auto sums = inner().grad_square_sums(split_);
    at::Tensor split_sq = torch::full({1}, sums[0], torch::kDouble);
    if (group_->world_size() > 1) group_->all_reduce(split_sq)->wait();
    const double sq = split_sq.item<double>() + sums[1];
    // A non-finite square anywhere stays non-finite on every rank: the fp16 overflow vote.
    if (!std::isfinite(sq)) return std::numeric_limits<double>::infinity();
    return std::sqrt(sq);
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
