// The shard optimizer's homes (memory, "cpu" offload, NVMe) run through one test body: the same
// gradients must give bit for bit the same partition, masters and moments whatever the home, in
// fp32 and bf16; a checkpoint taken from one home loads into another and training continues
// identically; parameters edited outside the optimizer become the masters; a swapped step that
// fails partway is refused until a load, one that fails before updating anything can be retried.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include <torch/torch.h>

#include "deepspeed/config.h"
#include "deepspeed/errors.h"
#include "offload/param_store.h"
#include "optim/fused_adam.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/stage3_layouts.h"
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

// A stage-3 parameter partition with every unit after the root in its swap file
// (offload_param "nvme", max_in_cpu 0): ParamStore::resident() is undefined. Units of 10 (the
// root), 5000, 9000 and 3 elements at world size 1.
struct SwappedParams {
  SwappedParams(const fs::path& dir, at::ScalarType dtype)
      : layout(dstest::one_rank_layout({10, 5000, 9000, 3})),
        store(layout, dtype, zero(dir), dstest::small_aio()) {}
  static deepspeed::ZeroConfig zero(const fs::path& dir) {
    deepspeed::ZeroConfig z;
    z.stage = 3;
    z.offload_param.device = "nvme";
    z.offload_param.nvme_path = dir.string();
    z.offload_param.max_in_cpu = 0;
    z.offload_param.buffer_count = 2;
    z.offload_param.buffer_size = 10000;
    return z;
  }
  deepspeed::zero::Stage3Layout layout;
  deepspeed::offload::ParamStore store;
};

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

// Stage 3 with offload_param "nvme" (the partition swapped) and offload_optimizer "cpu" on a GPU:
// the update reads its gradients in host memory, so the stage keeps its gradient partition there
// (unit_gradients.cpp), as DeepSpeed keeps it on the CPU whenever the optimizer is offloaded.
// Before, only a partition resident in host memory counted: a swapped one left Psi/N gradients on
// the GPU, copied down whole at every step. No CUDA call here: the shard's constructor makes no
// device buffer for a swapped partition (reduces_into_partition is left false, so no update
// during backward, whose streams would need a GPU).
TEST(ShardOptimizer, SwappedParametersOnAGpuKeepTheGradientsInHostMemory) {
  SwapDir dir;
  SwappedParams params(dir.path, at::kBFloat16);
  ASSERT_TRUE(params.store.swapped());
  ShardOptions options = home(OffloadDevice::kCpu, dir.path);
  options.compute_device = c10::Device(c10::kCUDA, 0);
  auto shard = deepspeed::zero::make_shard_optimizer(options, params.store, adamw());
  EXPECT_TRUE(shard->gradients_in_host_memory());
  EXPECT_EQ(shard->resident_host_bytes(), shard->resident_bytes()) << "masters on the host";
}

// offload_optimizer "cpu" over a swapped stage-3 partition: the update during backward
// (overlap_step) takes each unit's range as its gradients are final and updates the host masters,
// and the step writes the 16-bit values back to the store (its file); with overlap_step false the
// step updates all of it. Either way bit for bit the in-memory shard's step. Before, a swapped
// partition turned overlap_step off.
TEST(ShardOptimizer, SwappedParametersStepDuringBackwardIntoTheStore) {
  for (bool overlap : {true, false}) {
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE(std::string("overlap_step ") + (overlap ? "true " : "false ") +
                   c10::toString(dtype));
      SwapDir dir;
      SwappedParams params(dir.path, dtype);
      const int64_t numel = params.layout.partition_numel;
      torch::manual_seed(7);
      const at::Tensor start = torch::randn({numel}).to(dtype);
      params.store.write_all(start);
      at::Tensor reference = start.clone();
      TensorPartition in_memory(reference);
      auto plain = deepspeed::zero::make_shard_optimizer(home(OffloadDevice::kNone, dir.path),
                                                         in_memory, adamw());
      ShardOptions options = home(OffloadDevice::kCpu, dir.path);
      options.overlap_step = overlap;
      options.overlap_step_allowed = true;
      options.reduces_into_partition = true;
      auto shard = deepspeed::zero::make_shard_optimizer(options, params.store, adamw());
      ASSERT_EQ(shard->steps_during_backward(), overlap);
      for (int s = 0; s < 2; ++s) {
        const at::Tensor grads = torch::randn({numel}).to(dtype);
        plain->step(ShardGrads{grads.clone()}, in_memory, 1.0);
        if (overlap)
          for (const auto& unit : params.layout.units)
            shard->gradients_final(unit.partition_offset,
                                   grads.narrow(0, unit.partition_offset,
                                                unit.layout.partition_numel),
                                   params.store, nullptr);
        shard->step(ShardGrads{grads}, params.store, 1.0);
        EXPECT_EQ(shard->ranges_stepped_during_backward(),
                  overlap ? params.layout.units.size() : 0u);
      }
      EXPECT_TRUE(torch::equal(params.store.read_all(), reference)) << "the store";
      expect_same({reference, copies(shard->state_for_save())},
                  {reference, copies(plain->state_for_save())});
    }
  }
}

}  // namespace shard_optimizer_test
