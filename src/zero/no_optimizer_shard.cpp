#include "zero/no_optimizer_shard.h"

#include <torch/torch.h>

#include "deepspeed/errors.h"
#include "zero/tensor_facts.h"

namespace deepspeed {
namespace zero {
namespace {

class NoOptimizerShard final : public ShardOptimizer {
 public:
  explicit NoOptimizerShard(ParamPartition& params) : params_(params) {}

  void step(const ShardGrads&, ParamPartition&, double) override {
    throw Error("ZeRO: an optimizer step on an engine built without an optimizer (internal "
                "error: engine.step() should have refused it)");
  }
  std::shared_ptr<torch::optim::Optimizer> optimizer() const override { return nullptr; }

  std::array<at::Tensor, 3> state_for_save() override { return {widened(), {}, {}}; }
  std::array<at::Tensor, 3> state_for_load(bool) override {
    loading_ = widened();
    return {loading_, {}, {}};
  }
  std::unique_ptr<StateWindows> windows_for_save() override {
    return whole_state_windows(state_for_save());
  }
  std::unique_ptr<StateWindows> windows_for_load(bool create_moments) override {
    return whole_state_windows(state_for_load(create_moments));
  }
  // The loaded weights go into the partition (unless they were written into it directly).
  void finish_load(int64_t, ParamPartition& params) override {
    torch::NoGradGuard no_grad;
    if (loading_.defined() && !same_storage(loading_, params.resident()))
      params.write_all(loading_);
    loading_ = at::Tensor();
  }
  int64_t adam_step() const override { return -1; }
  // No masters to follow edits of the partition: it is the only copy.
  void refresh_masters(ParamPartition&) override {}
  void masters_edited(ParamPartition&, int64_t, const at::Tensor&) override {}

  int64_t resident_bytes() const override {
    return same_storage(loading_, params_.resident()) ? 0 : storage_bytes(loading_);
  }

 private:
  // The partition as fp32: itself when it is fp32 and in memory, else a widened copy (read from
  // its file when it is swapped).
  at::Tensor widened() const {
    torch::NoGradGuard no_grad;
    const at::Tensor resident = params_.resident();
    if (resident.defined() && resident.scalar_type() == at::kFloat) return resident;
    return (resident.defined() ? resident : params_.read_all()).to(at::kFloat);
  }
  static bool same_storage(const at::Tensor& a, const at::Tensor& b) {
    return a.defined() && b.defined() && a.is_alias_of(b);
  }

  ParamPartition& params_;
  at::Tensor loading_;  // between state_for_load and finish_load
};

}  // namespace

std::unique_ptr<ShardOptimizer> make_no_optimizer_shard(ParamPartition& params) {
  return std::make_unique<NoOptimizerShard>(params);
}

bool is_no_optimizer_shard(const ShardOptimizer& shard) {
  return dynamic_cast<const NoOptimizerShard*>(&shard) != nullptr;
}

}  // namespace zero
}  // namespace deepspeed
