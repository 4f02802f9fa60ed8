// The device seam: every tensor a flat stage allocates (parameter buffer, gradient buffer or
// partition, shard master) is made on StageContext::device, so a CUDA engine is a matter of
// giving the context a CUDA device. Checked here with libtorch's "meta" device, which every build
// has: a tensor allocated without the context's options would land on the CPU and show.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "deepspeed/comm.h"
#include "zero/flat_stage.h"

namespace stage_device_test {

using deepspeed::zero::FlatStage;
using deepspeed::zero::FlatStageOptions;
using deepspeed::zero::StageContext;

namespace {

// Leaf parameters made on the meta device (Module::to cannot move CPU parameters there).
std::vector<at::Tensor> meta_params() {
  std::vector<at::Tensor> params;
  for (auto shape : {std::vector<int64_t>{16, 8}, {16}, {3, 16}, {3}})
    params.push_back(torch::empty(shape, torch::device(torch::kMeta)).requires_grad_());
  return params;
}

// Optimizers that do not step are enough: construction is where the stage allocates.
std::shared_ptr<torch::optim::Optimizer> sgd(std::vector<at::Tensor> params) {
  return std::make_shared<torch::optim::SGD>(std::move(params), torch::optim::SGDOptions(0.1));
}

}  // namespace

class FlatStageOnTheContextDevice : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(FlatStageOnTheContextDevice, EveryStageTensorIsOnIt) {
  auto [partitioned, scatter] = GetParam();
  auto params = meta_params();
  StageContext ctx{deepspeed::comm::make_single_process_communicator(), torch::Device(torch::kMeta)};
  FlatStageOptions o;
  o.partitioned = partitioned;
  o.scatter_gradients = scatter;
  o.reduction.bucket_numel = 50;
  FlatStage stage(params, ctx, o, sgd);
  EXPECT_TRUE(stage.flat().buffer().is_meta());
  for (auto& p : params) {
    EXPECT_TRUE(p.is_meta());
    if (p.grad().defined()) EXPECT_TRUE(p.grad().is_meta());  // views of the gradient buffer
  }
  for (auto& group : stage.optimizer()->param_groups())
    for (auto& master : group.params()) EXPECT_TRUE(master.is_meta());
  EXPECT_GT(stage.memory().gradients, 0);
  // Nothing of it is host memory: MemoryReport counts device and host bytes apart.
  EXPECT_EQ(stage.memory().host_bytes, 0);
  EXPECT_EQ(stage.memory().device_bytes(), stage.memory().total());
}

INSTANTIATE_TEST_SUITE_P(Reducers, FlatStageOnTheContextDevice,
                         ::testing::Values(std::make_tuple(true, false), std::make_tuple(true, true),
                                           std::make_tuple(false, false)));

}  // namespace stage_device_test
