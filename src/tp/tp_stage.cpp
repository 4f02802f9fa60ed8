#include "tp/tp_stage.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>

namespace deepspeed {
namespace tp {
namespace {

class TensorParallelStage : public zero::ZeroStage {
 public:
  TensorParallelStage(std::unique_ptr<zero::ZeroStage> inner, comm::CommunicatorPtr group,
                      std::vector<at::Tensor> split)
      : inner_(std::move(inner)), group_(std::move(group)), split_(std::move(split)) {}

  void begin_backward(bool boundary) override { inner_->begin_backward(boundary); }
  void end_backward(bool boundary) override { inner_->end_backward(boundary); }
  // COLLECTIVE over the data-parallel group, then the tensor-parallel group.
  double global_grad_norm() override {
    const auto sums = inner_->grad_square_sums(split_);
    at::Tensor split_sq = torch::full({1}, sums[0], torch::kDouble);
    if (group_->world_size() > 1) group_->all_reduce(split_sq)->wait();
    const double sq = split_sq.item<double>() + sums[1];
    // A non-finite square anywhere stays non-finite on every rank: the fp16 overflow vote.
    if (!std::isfinite(sq)) return std::numeric_limits<double>::infinity();
    return std::sqrt(sq);
  }
  std::array<double, 2> grad_square_sums(const std::vector<at::Tensor>& selected) override {
    return inner_->grad_square_sums(selected);
  }
  void step(double grad_scale) override { inner_->step(grad_scale); }
  void discard_gradients() override { inner_->discard_gradients(); }
  MemoryReport memory() const override { return inner_->memory(); }
  std::shared_ptr<torch::optim::Optimizer> optimizer() const override {
    return inner_->optimizer();
  }
  std::unique_ptr<zero::FragmentState> state_to_save() override { return inner_->state_to_save(); }
  std::unique_ptr<zero::FragmentState> state_to_load(bool create) override {
    return inner_->state_to_load(create);
  }
  int64_t adam_step() const override { return inner_->adam_step(); }
  void finish_load(int64_t adam_step) override { inner_->finish_load(adam_step); }
  void refresh_masters_from_model() override { inner_->refresh_masters_from_model(); }
  std::vector<zero::StateFragment> fragments_of_rank(int rank, const std::vector<int64_t>& numels,
                                                     int world_size) const override {
    return inner_->fragments_of_rank(rank, numels, world_size);
  }
  bool replicated_state() const override { return inner_->replicated_state(); }
  void before_forward() override { inner_->before_forward(); }

 private:
  std::unique_ptr<zero::ZeroStage> inner_;
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
