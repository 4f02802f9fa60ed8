// The shard optimizer's homes (memory, "cpu" offload, NVMe) run through one test body: the same
// gradients must give bit for bit the same partition, masters and moments whatever the home, in
// fp32 and bf16; a checkpoint taken from one home loads into another and training continues
// identically; parameters edited outside the optimizer become the masters; a swapped step that
// fails partway is refused until a load, one that fails before updating anything can be retried.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include <torch/torch.h>

#include "deepspeed/errors.h"
#include "optim/fused_adam.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/swap_files.h"
#include "zero/shard_optimizer.h"

namespace shard_optimizer_test {

namespace fs = std::filesystem;
using deepspeed::zero::OffloadDevice;
using deepspeed::zero::ShardGrads;
using deepspeed::zero::ShardOptimizer;
using deepspeed::zero::ShardOptions;
using deepspeed::zero::TensorPartition;

namespace {

// A real file system: the NVMe home uses O_DIRECT, which tmpfs refuses.
struct SwapDir {
  dstest::TempDir dir{"shard_optimizer_test", dstest::TempDir::Base::kDisk};
  fs::path path{dir.path()};
};

deepspeed::zero::OptimizerFactory adamw() {
  return [](std::vector<at::Tensor> params) {
    deepspeed::AdamHyper h;
    h.lr = 1e-2;
    h.weight_decay = 0.1;
    return std::make_shared<deepspeed::optim::FusedAdam>(std::move(params), h);
  };
}

ShardOptions home(OffloadDevice device, const fs::path& dir) {
  ShardOptions o;
  o.home = device;
  o.nvme_path = dir.string();
  o.sub_group_size = 1000;  // several sub-groups, the last one short
  o.buffer_count = 3;
  o.aio.block_size = 8192;
  return o;
}

constexpr int64_t kNumel = 4099;

at::Tensor gradient(int step, at::ScalarType dtype) {
  torch::manual_seed(100 + step);
  return torch::randn({kNumel}).to(dtype);
}

struct Trained {
  at::Tensor partition;
  std::array<at::Tensor, 3> state;  // copies
};

std::array<at::Tensor, 3> copies(const std::array<at::Tensor, 3>& s) {
  return {s[0].clone(), s[1].defined() ? s[1].clone() : s[1], s[2].defined() ? s[2].clone() : s[2]};
}

// `steps` updates of a fresh shard at `device`, with grad_scale 0.5 on the second.
Trained train(OffloadDevice device, at::ScalarType dtype, int steps, const fs::path& dir) {
  torch::manual_seed(7);
  at::Tensor values = torch::randn({kNumel}).to(dtype);
  TensorPartition partition(values);
  auto shard = deepspeed::zero::make_shard_optimizer(home(device, dir), partition, adamw());
  for (int s = 0; s < steps; ++s)
    shard->step(ShardGrads{gradient(s, dtype)}, partition, s == 1 ? 0.5 : 1.0);
  EXPECT_EQ(shard->adam_step(), steps);
  return {values.clone(), copies(shard->state_for_save())};
}

void expect_same(const Trained& a, const Trained& b) {
  EXPECT_TRUE(torch::equal(a.partition, b.partition));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(a.state[i], b.state[i])) << "state " << i;
}

}  // namespace

class ShardHomes : public ::testing::TestWithParam<std::tuple<OffloadDevice, at::ScalarType>> {};

TEST_P(ShardHomes, StepMatchesTheInMemoryShardBitForBit) {
  auto [device, dtype] = GetParam();
  SwapDir dir;
  expect_same(train(device, dtype, 4, dir.path), train(OffloadDevice::kNone, dtype, 4, dir.path));
}

TEST_P(ShardHomes, CheckpointFromAnyHomeResumesInAnyOther) {
  auto [device, dtype] = GetParam();
  SwapDir dir;
  const Trained reference = train(OffloadDevice::kNone, dtype, 5, dir.path);

  // Three steps here, save; load into a shard at the other home; two more steps there.
  torch::manual_seed(7);
  at::Tensor values = torch::randn({kNumel}).to(dtype);
  TensorPartition partition(values);
  auto first = deepspeed::zero::make_shard_optimizer(home(device, dir.path), partition, adamw());
  for (int s = 0; s < 3; ++s)
    first->step(ShardGrads{gradient(s, dtype)}, partition, s == 1 ? 0.5 : 1.0);
  const auto saved = copies(first->state_for_save());
  const int64_t step = first->adam_step();
  first.reset();

  const OffloadDevice other = device == OffloadDevice::kNvme ? OffloadDevice::kNone : OffloadDevice::kNvme;
  at::Tensor reloaded = torch::zeros({kNumel}, dtype);
  TensorPartition target(reloaded);
  auto second = deepspeed::zero::make_shard_optimizer(home(other, dir.path), target, adamw());
  auto state = second->state_for_load(/*create_moments=*/true);
  for (int i = 0; i < 3; ++i) state[i].copy_(saved[i]);
  second->finish_load(step, target);
  EXPECT_EQ(second->adam_step(), 3);
  EXPECT_TRUE(torch::equal(reloaded, saved[0].to(dtype)));  // the partition follows the masters
  for (int s = 3; s < 5; ++s) second->step(ShardGrads{gradient(s, dtype)}, target, 1.0);
  expect_same({reloaded.clone(), copies(second->state_for_save())}, reference);
}

TEST_P(ShardHomes, EditedParametersBecomeTheMasters) {
  auto [device, dtype] = GetParam();
  SwapDir dir;
  torch::manual_seed(7);
  at::Tensor values = torch::randn({kNumel}).to(dtype);
  TensorPartition partition(values);
  auto shard = deepspeed::zero::make_shard_optimizer(home(device, dir.path), partition, adamw());
  shard->step(ShardGrads{gradient(0, dtype)}, partition, 1.0);
  at::Tensor edit = torch::full({100}, 0.25, dtype);
  values.narrow(0, 2000, 100).copy_(edit);
  shard->masters_edited(partition, 2000, edit);
  auto masters = shard->state_for_save()[0];
  EXPECT_TRUE(torch::equal(masters.narrow(0, 2000, 100), edit.to(torch::kFloat)));
  // After a whole refresh every master equals the partition (widened).
  values.fill_(-1.5);
  shard->refresh_masters(partition);
  EXPECT_TRUE(torch::equal(shard->state_for_save()[0], values.to(torch::kFloat)));
}

INSTANTIATE_TEST_SUITE_P(
    MemoryCpuNvme, ShardHomes,
    ::testing::Combine(::testing::Values(OffloadDevice::kNone, OffloadDevice::kCpu,
                                         OffloadDevice::kNvme),
                       ::testing::Values(at::kFloat, at::kBFloat16)));

TEST(ShardOptimizer, NvmeHomeRefusesAnOptimizerItCannotSwap) {
  SwapDir dir;
  at::Tensor values = torch::zeros({kNumel});
  TensorPartition partition(values);
  auto sgd = [](std::vector<at::Tensor> params) -> std::shared_ptr<torch::optim::Optimizer> {
    return std::make_shared<torch::optim::SGD>(std::move(params), torch::optim::SGDOptions(0.1));
  };
  try {
    deepspeed::zero::make_shard_optimizer(home(OffloadDevice::kNvme, dir.path), partition, sgd);
    FAIL() << "expected a ConfigError";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("offload_optimizer.device"), std::string::npos) << e.what();
  }
}

// A swapped step that fails once it has updated a sub-group (here: the state file cut short
// under the job, sub-groups 0 and 1 readable, 2 not) leaves some sub-groups a step on and the rest
// not: the shard says so, refuses every step until a load of the optimizer states (a retry would
// step sub-groups 0 and 1 twice), and a load of the weights alone does not repair it. After the
// load, training goes on exactly as if the failed step had never run.
TEST(SwappedShard, AStepThatFailsAfterUpdatingASubGroupIsLostUntilALoad) {
  SwapDir dir;
  const Trained reference = train(OffloadDevice::kNone, at::kFloat, 2, dir.path);
  torch::manual_seed(7);
  at::Tensor values = torch::randn({kNumel});
  TensorPartition partition(values);
  auto shard = deepspeed::zero::make_shard_optimizer(home(OffloadDevice::kNvme, dir.path),
                                                     partition, adamw());
  shard->step(ShardGrads{gradient(0, at::kFloat)}, partition, 1.0);
  const auto saved = copies(shard->state_for_save());

  const auto file = dstest::unlinked_files_in(dir.dir.path());
  ASSERT_EQ(file.size(), 1u);
  const std::string whole = dstest::read_bytes(file[0]);
  ASSERT_EQ(::truncate(file[0].c_str(), static_cast<off_t>(whole.size() / 2)), 0);
  EXPECT_THROW(shard->step(ShardGrads{gradient(1, at::kFloat)}, partition, 0.5),
               deepspeed::IOError);
  EXPECT_TRUE(shard->step_lost());
  dstest::write_bytes(file[0], whole);  // the disk is back: the state is still half stepped
  const std::string again = dstest::message_of<deepspeed::Error>(
      [&] { shard->step(ShardGrads{gradient(1, at::kFloat)}, partition, 0.5); });
  EXPECT_CONTAINS(again, "partly stepped");
  EXPECT_CONTAINS(again, "load_checkpoint");
  EXPECT_CONTAINS(again, "offload_optimizer.nvme_path");

  auto load = [&](int64_t adam_step) {
    auto state = shard->state_for_load(/*create_moments=*/true);
    for (int i = 0; i < 3; ++i) state[i].copy_(saved[i]);
    shard->finish_load(adam_step, partition);
  };
  load(-1);  // the weights alone
  EXPECT_TRUE(shard->step_lost()) << "a load without the optimizer states repaired the step";
  load(1);
  EXPECT_FALSE(shard->step_lost());
  shard->step(ShardGrads{gradient(1, at::kFloat)}, partition, 0.5);
  EXPECT_EQ(shard->adam_step(), 2);
  expect_same({values.clone(), copies(shard->state_for_save())}, reference);
}

// A swapped step that fails before it has updated anything (the first read fails) changes
// nothing, the step count included: once the file is back, the retry is the step.
TEST(SwappedShard, AStepThatFailsBeforeUpdatingAnythingCanBeRetried) {
  SwapDir dir;
  const Trained reference = train(OffloadDevice::kNone, at::kFloat, 1, dir.path);
  torch::manual_seed(7);
  at::Tensor values = torch::randn({kNumel});
  const at::Tensor before = values.clone();
  TensorPartition partition(values);
  auto shard = deepspeed::zero::make_shard_optimizer(home(OffloadDevice::kNvme, dir.path),
                                                     partition, adamw());
  const auto file = dstest::unlinked_files_in(dir.dir.path());
  ASSERT_EQ(file.size(), 1u);
  const std::string whole = dstest::read_bytes(file[0]);
  ASSERT_EQ(::truncate(file[0].c_str(), 0), 0);
  EXPECT_THROW(shard->step(ShardGrads{gradient(0, at::kFloat)}, partition, 1.0),
               deepspeed::IOError);
  EXPECT_FALSE(shard->step_lost());
  EXPECT_EQ(shard->adam_step(), 0);
  EXPECT_TRUE(torch::equal(values, before));
  dstest::write_bytes(file[0], whole);
  shard->step(ShardGrads{gradient(0, at::kFloat)}, partition, 1.0);
  EXPECT_EQ(shard->adam_step(), 1);
  expect_same({values.clone(), copies(shard->state_for_save())}, reference);
}

}  // namespace shard_optimizer_test
