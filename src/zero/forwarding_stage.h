// A ZeroStage that hands every call to an inner stage: the base of wrappers that change one
// thing about a stage seen from outside (pipe/pipe_stage.h, tp/tp_stage.cpp: the gradient norm
// summed over another group) and must keep all the rest, including whatever ZeroStage gains
// later, the inner stage's.
#pragma once
#include <memory>
#include <utility>
#include <vector>

#include "zero/stage.h"

namespace deepspeed {
namespace zero {

class ForwardingStage : public ZeroStage {
 public:
  explicit ForwardingStage(std::unique_ptr<ZeroStage> inner) : inner_(std::move(inner)) {}

  void begin_backward(bool boundary) override { inner_->begin_backward(boundary); }
  void expect_gradients_from(const at::Tensor& root) override {
    inner_->expect_gradients_from(root);
  }
  void end_backward(bool boundary) override { inner_->end_backward(boundary); }
  void abandon_backward() override { inner_->abandon_backward(); }
  bool steps_during_backward() const override { return inner_->steps_during_backward(); }
  size_t ranges_stepped_during_backward() const override {
    return inner_->ranges_stepped_during_backward();
  }
  bool update_begun_during_backward() const override {
    return inner_->update_begun_during_backward();
  }
  bool gathered_scope_open() const override { return inner_->gathered_scope_open(); }
  bool step_lost() const override { return inner_->step_lost(); }
  double global_grad_norm() override { return inner_->global_grad_norm(); }
  // A wrapper that changes the norm overrides both (the tensor keeps a GPU step free of host
  // waits; the value is read from it).
  at::Tensor global_grad_norm_tensor() override { return inner_->global_grad_norm_tensor(); }
  void step(double grad_scale) override { inner_->step(grad_scale); }
  void discard_gradients() override { inner_->discard_gradients(); }
  MemoryReport memory() const override { return inner_->memory(); }
  std::shared_ptr<torch::optim::Optimizer> optimizer() const override { return inner_->optimizer(); }
  std::unique_ptr<FragmentState> state_to_save() override { return inner_->state_to_save(); }
  std::unique_ptr<FragmentState> state_to_load(bool create) override {
    return inner_->state_to_load(create);
  }
  int64_t adam_step() const override { return inner_->adam_step(); }
  void finish_load(int64_t adam_step) override { inner_->finish_load(adam_step); }
  void refresh_masters_from_model() override { inner_->refresh_masters_from_model(); }
  std::vector<StateFragment> fragments_of_rank(int rank, const std::vector<int64_t>& numels,
                                               int world_size) const override {
    return inner_->fragments_of_rank(rank, numels, world_size);
  }
  bool replicated_state() const override { return inner_->replicated_state(); }
  int gather_group_of(const at::Tensor& param) const override {
    return inner_->gather_group_of(param);
  }
  std::vector<int64_t> whole_shape(const at::Tensor& param) const override {
    return inner_->whole_shape(param);
  }
  std::function<void()> gather_group(int group, std::optional<int> modifier_rank) override {
    return inner_->gather_group(group, modifier_rank);
  }
  at::Tensor agreed_across_data_ranks(at::Tensor norm) override {
    return inner_->agreed_across_data_ranks(std::move(norm));
  }
  at::Tensor grad_square_sums(const std::vector<at::Tensor>& selected) override {
    return inner_->grad_square_sums(selected);
  }
  void before_forward() override { inner_->before_forward(); }
  void complete_step() override { inner_->complete_step(); }
  bool step_handed_over() const override { return inner_->step_handed_over(); }
  std::function<void()> gather_for_access(
      const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
      std::optional<int> modifier_rank) override {
    return inner_->gather_for_access(modules, modifier_rank);
  }

 protected:
  ZeroStage& inner() { return *inner_; }

 private:
  std::unique_ptr<ZeroStage> inner_;
};

}  // namespace zero
}  // namespace deepspeed
