// The CUDA path (label gpu): the example GPT trained on a GPU at every ZeRO stage, dtype and
// offload home, checked against stage 0 on the same GPU; two ranks sharing the GPU over Gloo;
// checkpoints moved between the GPU and the CPU; an out-of-memory reported in words. Every test
// of the CUDA path skips, saying why, on a machine or build without a GPU (CI), and fails there
// under DS_EXPECT_GPU=1 (bench/gpu/run.sh); the GpuTestSupport cases need no GPU.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <string>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include "checkpoint/file_system.h"
#include "checkpoint/tag_reader.h"
#include "comm/nccl_communicator.h"
#include "deepspeed/device.h"
#include "deepspeed/engine.h"
#include "deepspeed/memory.h"
#include "device/pinned_memory.h"
#include "device/transfer_stream.h"
#include "offload/param_store.h"
#include "optim/fused_adam.h"
#include "optim/lion.h"
#include "runtime/engine_state.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/param_groups.h"
#include "support/scoped_env.h"
#include "support/stage3_layouts.h"
#include "support/training_run.h"
#include "zero/shard_optimizer.h"
#include "zero/tensor_facts.h"
#include "support/deterministic.h"
#include "support/gpu_skip.h"

#ifdef DS_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace {

// The guard gives the mode back as it found it, warn-only included (no GPU needed).
TEST(GpuTestSupport, DeterministicModeEndsWithItsGuard) {
  auto& context = at::globalContext();
  for (bool warn_only : {false, true}) {
    for (bool on : {false, true}) {
      context.setDeterministicAlgorithms(on, warn_only);
      {
        const dstest::Deterministic deterministic;
        EXPECT_TRUE(context.deterministicAlgorithms());
        EXPECT_FALSE(context.deterministicAlgorithmsWarnOnly());
      }
      EXPECT_EQ(context.deterministicAlgorithms(), on) << "warn_only " << warn_only;
      EXPECT_EQ(context.deterministicAlgorithmsWarnOnly(), warn_only) << "on " << on;
    }
  }
  context.setDeterministicAlgorithms(false, false);
}

// What SKIP_WITHOUT_GPU reports, with DS_EXPECT_GPU set to `expect` (nullptr: unset): "ran"
// (nothing: the test goes on), "skipped" or "failed: " and the message.
std::string skip_outcome(const char* expect) {
  const char* old = std::getenv("DS_EXPECT_GPU");
  const std::optional<std::string> saved = old ? std::optional<std::string>(old) : std::nullopt;
  if (expect) setenv("DS_EXPECT_GPU", expect, 1);
  else unsetenv("DS_EXPECT_GPU");
  testing::TestPartResultArray results;
  {
    testing::ScopedFakeTestPartResultReporter reporter(
        testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    [] { SKIP_WITHOUT_GPU(); }();
  }
  if (saved) setenv("DS_EXPECT_GPU", saved->c_str(), 1);
  else unsetenv("DS_EXPECT_GPU");
  if (results.size() == 0) return "ran";
  const testing::TestPartResult& r = results.GetTestPartResult(0);
  if (results.size() == 1 && r.skipped()) return "skipped";
  return std::string(r.fatally_failed() ? "failed: " : "other: ") + r.message();
}

// On the GPU machine (bench/gpu/run.sh sets DS_EXPECT_GPU=1) a GPU test that finds no GPU fails,
// saying so, instead of skipping with the program's exit status 0; elsewhere it skips; with a
// GPU it runs.
TEST(GpuTestSupport, SkipWithoutGpuFailsWhereAGpuIsExpected) {
  if (deepspeed::cuda_available()) {
    EXPECT_EQ(skip_outcome("1"), "ran");
    EXPECT_EQ(skip_outcome(nullptr), "ran");
    return;
  }
  EXPECT_EQ(skip_outcome(nullptr), "skipped");
  EXPECT_EQ(skip_outcome("0"), "skipped");
  const std::string expected = skip_outcome("1");
  EXPECT_EQ(expected.rfind("failed: ", 0), 0u) << expected;
  EXPECT_CONTAINS(expected, "DS_EXPECT_GPU is set");
  EXPECT_CONTAINS(expected, "the CUDA path was not tested");
}

enum class Home { kNone, kOptimizerCpu, kParamAndOptimizerCpu, kNvme };
const char* name_of(Home h) {
  switch (h) {
    case Home::kNone: return "none";
    case Home::kOptimizerCpu: return "opt_cpu";
    case Home::kParamAndOptimizerCpu: return "param_opt_cpu";
    case Home::kNvme: return "nvme";
  }
  return "?";
}

nlohmann::json config_for(int stage, bool bf16, Home home, const std::string& nvme_dir) {
  auto c = dstest::base_config(/*micro_batch=*/4, /*accumulation=*/1, stage);
  if (bf16) c["bf16"] = {{"enabled", true}};
  auto& z = c["zero_optimization"];
  // At stage 3 no parameter persists: every parameter of the test GPTs is under the default
  // threshold (100,000 elements), which would keep them all whole in the root unit and leave the
  // partitioning, gathering and release on the GPU untested.
  if (stage == 3) z["stage3_param_persistence_threshold"] = 0;
  if (home == Home::kOptimizerCpu || home == Home::kParamAndOptimizerCpu)
    z["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
  if (home == Home::kParamAndOptimizerCpu) z["offload_param"] = {{"device", "cpu"}};
  if (home == Home::kNvme) {
    z["offload_optimizer"] = {{"device", "nvme"}, {"nvme_path", nvme_dir}};
    if (stage == 3) z["offload_param"] = {{"device", "nvme"}, {"nvme_path", nvme_dir}};
  }
  return c;
}

// World size 1 on the GPU over NCCL, for `steps` steps.
dstest::RunSpec one_gpu_run(int steps) {
  dstest::RunSpec spec;
  spec.backend = "nccl";
  spec.device = "cuda";
  spec.steps = steps;
  return spec;
}

dstest::RunResult train_on_gpu(int stage, bool bf16, Home home, int world = 1) {
  dstest::TempDir nvme("ds_gpu_nvme", dstest::TempDir::Base::kDisk);
  dstest::RunSpec spec;
  spec.world_size = world;
  spec.backend = world == 1 ? "nccl" : "gloo";
  spec.device = "cuda";
  spec.steps = 20;
  spec.config = config_for(stage, bf16, home, nvme.path());
  return dstest::train_gpt(spec);
}

struct Case {
  int stage;
  bool bf16;
  Home home;
};
std::string case_name(const testing::TestParamInfo<Case>& info) {
  return "stage" + std::to_string(info.param.stage) + (info.param.bf16 ? "_bf16_" : "_fp32_") +
         name_of(info.param.home);
}

class OneGpu : public testing::TestWithParam<Case> {};

// World size 1 on NCCL: every stage and home trains as stage 0 without offload does — within
// 1e-6 relative in fp32 (the same arithmetic up to summation order), 1e-5 when the CPU Adam
// replaces the GPU's fused Adam, 1e-2 in bf16 (roundings of 16-bit parameters).
TEST_P(OneGpu, TrainsAsStageZero) {
  SKIP_WITHOUT_GPU();
  const dstest::Deterministic deterministic;
  const Case c = GetParam();
  auto reference = train_on_gpu(0, c.bf16, Home::kNone);
  auto run = train_on_gpu(c.stage, c.bf16, c.home);
  ASSERT_EQ(run.losses.size(), 20u);
  EXPECT_LT(run.losses.back(), run.losses.front()) << "the loss did not fall";
  const double tol = c.bf16 ? 1e-2 : (c.home == Home::kNone ? 1e-6 : 1e-5);
  EXPECT_LE(dstest::max_loss_rel_diff(run, reference), tol);
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (bool bf16 : {false, true})
    for (int stage = 0; stage <= 3; ++stage)
      for (Home home : {Home::kNone, Home::kOptimizerCpu, Home::kParamAndOptimizerCpu, Home::kNvme}) {
        if (stage == 0 && home != Home::kNone) continue;  // offload needs ZeRO (stage >= 1)
        if (stage == 0 && !bf16) continue;                // the reference itself
        if (home == Home::kParamAndOptimizerCpu && stage != 3) continue;
        cases.push_back({stage, bf16, home});
      }
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Stages, OneGpu, testing::ValuesIn(all_cases()), case_name);

// ZeRO-Offload's update during backward (offload_optimizer.overlap_step, on by default on a GPU):
// the ranges updated on the host thread while backward goes on, uploaded on a side stream, give
// bit for bit the serial step's training, at stages 2 and 3 (param + optimizer offload), with
// page-locked buffers and without (pageable: each range's fence is passed by the engine's thread
// once it has put the bucket's staged copy in), and the ranges were handed to the update during
// backward (the overlap is on; how much of the update it hides is the benchmark's to measure).
TEST(OneGpuOffload, UpdateDuringBackwardIsTheSerialStep) {
  SKIP_WITHOUT_GPU();
  const dstest::Deterministic deterministic;
  for (int stage : {2, 3}) {
    for (bool pin : {true, false}) {
      dstest::RunSpec spec = one_gpu_run(10);
      spec.config = config_for(stage, true, stage == 3 ? Home::kParamAndOptimizerCpu : Home::kOptimizerCpu, "");
      spec.config["zero_optimization"]["offload_optimizer"]["pin_memory"] = pin;
      spec.config["zero_optimization"]["offload_optimizer"]["overlap_step"] = false;
      auto serial = dstest::train_gpt(spec);
      spec.config["zero_optimization"]["offload_optimizer"]["overlap_step"] = true;
      size_t ranges = 0;
      spec.after_training = [&](deepspeed::Engine& engine) {
        ranges = deepspeed::state_of(engine).stage->ranges_stepped_during_backward();
      };
      auto overlapped = dstest::train_gpt(spec);
      EXPECT_GT(ranges, 0u) << "stage " << stage << " pin " << pin << ": no range taken during backward";
      ASSERT_EQ(overlapped.losses, serial.losses) << "stage " << stage << " pin " << pin;
      for (size_t i = 0; i < serial.weights.size(); ++i)
        EXPECT_TRUE(torch::equal(overlapped.weights[i], serial.weights[i]))
            << "stage " << stage << " pin " << pin << " parameter " << i;
    }
  }
}

// offload_optimizer.overlap_forward (zero/forward_waits.h): step() hands the update's last
// ranges over, the next forward's units each wait (the compute stream, on the range's upload)
// for their own parameters. Training is bit for bit the waiting step's at stages 1 and 2, page-
// locked and (stage 2) pageable, and step() did hand over.
TEST(OneGpuOffload, OverlapForwardIsTheWaitingStep) {
  SKIP_WITHOUT_GPU();
  const dstest::Deterministic deterministic;
  for (auto [stage, pin] : {std::pair{1, true}, {2, true}, {2, false}}) {
    dstest::RunSpec spec = one_gpu_run(10);
    spec.config = config_for(stage, true, Home::kOptimizerCpu, "");
    spec.config["zero_optimization"]["offload_optimizer"]["pin_memory"] = pin;
    auto waiting = dstest::train_gpt(spec);
    spec.config["zero_optimization"]["offload_optimizer"]["overlap_forward"] = true;
    bool handed_over = false;
    spec.after_training = [&](deepspeed::Engine& engine) {
      handed_over = deepspeed::state_of(engine).stage->step_handed_over();
    };
    auto handed = dstest::train_gpt(spec);
    EXPECT_TRUE(handed_over) << "stage " << stage << " pin " << pin << ": step() waited";
    ASSERT_EQ(handed.losses, waiting.losses) << "stage " << stage << " pin " << pin;
    for (size_t i = 0; i < waiting.weights.size(); ++i)
      EXPECT_TRUE(torch::equal(handed.weights[i], waiting.weights[i]))
          << "stage " << stage << " pin " << pin << " parameter " << i;
  }
}

// With accumulation the offloaded gradient partition (host memory) is added to on the GPU a
// bucket at a time (up, add, down on the download stream): over 3 micro-steps, with clipping
// (the norm summed on the GPU as the buckets come down), stages 2 and 3 train as without offload
// within the CPU-Adam tolerance, and the gradients are counted in host memory. Without
// pin_memory (DeepSpeed's default) the partition is pageable: the buckets come down through
// page-locked copies, the host adds, and the GPU still holds no gradient partition.
TEST(OneGpuOffload, GradientsAccumulateInHostMemory) {
  SKIP_WITHOUT_GPU();
  const dstest::Deterministic deterministic;
  for (int stage : {2, 3}) {
    dstest::RunSpec spec = one_gpu_run(6);
    spec.config = dstest::base_config(/*micro_batch=*/2, /*accumulation=*/3, stage);
    spec.config["gradient_clipping"] = 0.05;
    auto plain = dstest::train_gpt(spec);
    for (bool pin : {true, false}) {
      spec.config["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", pin}};
      if (stage == 3) spec.config["zero_optimization"]["offload_param"] = {{"device", "cpu"}};
      auto offloaded = dstest::train_gpt(spec);
      EXPECT_LE(dstest::max_loss_rel_diff(offloaded, plain), 1e-5) << "stage " << stage << " pin " << pin;
      const auto& m = offloaded.memory[0];
      // On the GPU: the 16-bit parameters (none at stage 3, offload_param), the buckets and the
      // gathered units; no gradient partition. Pageable, the buckets' page-locked copies are
      // communication buffers in host memory.
      EXPECT_EQ(m.host_comm_buffers > 0, !pin) << "stage " << stage << " pin " << pin;
      EXPECT_EQ(m.device_bytes(), m.parameters * (stage == 3 ? 0 : 1) + m.comm_buffers -
                                      m.host_comm_buffers + m.gathered_bytes)
          << "stage " << stage << " pin " << pin;
      EXPECT_GE(m.host_bytes, m.gradients + m.optimizer_states + m.host_comm_buffers)
          << "stage " << stage << " pin " << pin;
    }
  }
}

// Stage 3 with offload_param "nvme" beyond max_in_cpu (every block's slice in the file) and
// offload_optimizer "cpu": the gradient partition lives in host memory, as with offload_param
// "cpu" (DeepSpeed keeps it on the CPU whenever the optimizer is offloaded), the update during
// backward (on by default on a GPU) takes the units' ranges, updating the host masters, and the
// step writes them back to the file; training is the same run's with the partition in host
// memory (max_in_cpu above it). Before, a swapped partition left the gradient partition on the
// GPU (Psi/N, copied down whole at every step) and overlap_step silently off.
TEST(OneGpuOffload, SwappedParametersKeepTheGradientsInHostMemory) {
  SKIP_WITHOUT_GPU();
  const dstest::Deterministic deterministic;
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    dstest::TempDir nvme("gpu_swapped_params", dstest::TempDir::Base::kDisk);
    dstest::RunSpec spec = one_gpu_run(10);
    spec.model.n_layer = 4;  // more blocks than the store's 2 slice buffers
    spec.config = config_for(3, bf16, Home::kOptimizerCpu, "");  // offload_optimizer cpu, pinned
    spec.config["zero_optimization"]["offload_param"] = {{"device", "nvme"},
                                                         {"nvme_path", nvme.path()},
                                                         {"buffer_count", 2},
                                                         {"max_in_cpu", 1000000000}};
    auto in_ram = dstest::train_gpt(spec);
    spec.config["zero_optimization"]["offload_param"]["max_in_cpu"] = 0;
    size_t ranges = 0;
    spec.after_training = [&](deepspeed::Engine& engine) {
      ranges = deepspeed::state_of(engine).stage->ranges_stepped_during_backward();
    };
    auto swapped = dstest::train_gpt(spec);
    const auto& m = swapped.memory[0];
    EXPECT_LT(m.parameters, in_ram.memory[0].parameters) << "the partition was not swapped";
    EXPECT_GT(ranges, 0u) << "no range taken during backward";
    EXPECT_LE(dstest::max_loss_rel_diff(swapped, in_ram), 1e-6);
    // On the GPU only the buckets and the gathered units: no parameter or gradient partition,
    // no masters or moments.
    EXPECT_EQ(m.device_bytes(), m.comm_buffers - m.host_comm_buffers + m.gathered_bytes);
    EXPECT_GE(m.host_bytes, m.gradients + m.optimizer_states);
  }
}

// The offload's host buffers are registered with the driver at their own size (libtorch's
// pinned allocator would round 3,000,001 floats up to 16 MiB): page-locked, and asynchronous
// copies through them arrive intact both ways.
TEST(OneGpuPinned, HostBuffersArePageLockedAndCopyBothWays) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 3000001;
  const c10::Device gpu(c10::kCUDA, 0);
  at::Tensor up = deepspeed::device::host_buffer(n, at::kFloat, /*pin=*/true, gpu);
  at::Tensor down = deepspeed::device::host_buffer(n, at::kFloat, /*pin=*/true, gpu);
  EXPECT_TRUE(up.is_pinned());
  EXPECT_EQ(up.numel(), n);
  EXPECT_FALSE(deepspeed::device::host_buffer(n, at::kFloat, /*pin=*/false, gpu).is_pinned());
  EXPECT_FALSE(deepspeed::device::host_buffer(n, at::kFloat, /*pin=*/true, c10::kCPU).is_pinned());
  up.copy_(torch::randn({n}));
  at::Tensor on_gpu = torch::empty({n}, torch::device(torch::kCUDA));
  deepspeed::device::SideStream side(on_gpu.device());
  side.follow_current();  // after whatever filled on_gpu on the compute stream (torch 2.x: NaN)
  side.copy(on_gpu, up)->wait();
  side.copy(down, on_gpu)->wait();
  EXPECT_TRUE(torch::equal(up, down));
}

// ZeRO-Infinity's parameter partition in host memory and its slices from NVMe are page-locked
// whatever offload_param.pin_memory says (as DeepSpeed pins both), so a unit's upload is
// asynchronous (before, pin_memory false, the default, left them pageable); the upload brings
// the file's values.
TEST(OneGpuPinned, NvmeParameterSlicesArePageLocked) {
  SKIP_WITHOUT_GPU();
  const c10::Device gpu(c10::kCUDA, 0);
  const auto layout = dstest::one_rank_layout({10, 5000, 9000, 3});
  for (bool pin : {true, false}) {
    dstest::TempDir dir("gpu_nvme_params", dstest::TempDir::Base::kDisk);
    deepspeed::ZeroConfig zero;
    zero.stage = 3;
    zero.offload_param.device = "nvme";
    zero.offload_param.nvme_path = dir.path();
    zero.offload_param.max_in_cpu = 0;
    zero.offload_param.buffer_count = 2;
    zero.offload_param.buffer_size = 10000;
    zero.offload_param.pin_memory = pin;
    deepspeed::offload::ParamStore store(layout, at::kBFloat16, zero, dstest::small_aio(), gpu);
    EXPECT_TRUE(store.memory().is_pinned()) << "pin_memory " << pin;  // the root unit's slice
    at::Tensor all = torch::randn({layout.partition_numel}).to(at::kBFloat16);
    store.write_all(all);
    at::Tensor slice = store.fetch(2);
    EXPECT_TRUE(slice.is_pinned()) << "pin_memory " << pin;
    at::Tensor on_gpu = torch::empty({slice.numel()}, torch::device(gpu).dtype(at::kBFloat16));
    deepspeed::device::SideStream side(gpu);
    side.follow_current();  // after whatever filled on_gpu on the compute stream (torch 2.x: NaN)
    auto uploaded = side.copy(on_gpu, slice);
    store.done(2, uploaded);
    uploaded->wait();
    EXPECT_TRUE(torch::equal(on_gpu.cpu(), all.narrow(0, layout.units[2].partition_offset, 9000)));
  }
}

// Stage 3 with offload_param "cpu" or "nvme" and no optimizer offload: the fp32 masters and the
// moments live on the GPU and the step runs there (as DeepSpeed's stage 3, whose fp32 partitions
// follow the compute device unless the optimizer is offloaded); its result reaches the store.
// Before, the masters were in host memory (12Ψ/N host bytes, a CPU step).
TEST(OneGpuOffload, OffloadParamAloneKeepsTheMastersOnTheGpu) {
  SKIP_WITHOUT_GPU();
  const c10::Device gpu(c10::kCUDA, 0);
  const auto layout = dstest::one_rank_layout({10, 5000, 9000, 3});
  for (const char* device : {"cpu", "nvme"}) {
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE(std::string(device) + " " + c10::toString(dtype));
      dstest::TempDir dir("gpu_offload_param", dstest::TempDir::Base::kDisk);
      deepspeed::ZeroConfig zero;
      zero.stage = 3;
      zero.offload_param.device = device;
      zero.offload_param.nvme_path = dir.path();
      zero.offload_param.max_in_cpu = 0;
      zero.offload_param.buffer_count = 2;
      zero.offload_param.buffer_size = 10000;
      deepspeed::offload::ParamStore store(layout, dtype, zero, dstest::small_aio(), gpu);
      at::Tensor start = torch::randn({layout.partition_numel}).to(dtype);
      store.write_all(start);
      deepspeed::zero::ShardOptions options;  // home none: no optimizer offload
      options.compute_device = gpu;
      auto shard =
          deepspeed::zero::make_shard_optimizer(options, store, [](std::vector<at::Tensor> p) {
            return std::make_shared<deepspeed::optim::FusedAdam>(std::move(p),
                                                                 deepspeed::AdamHyper{});
          });
      EXPECT_TRUE(shard->state_for_save()[0].is_cuda());
      EXPECT_EQ(shard->resident_host_bytes(), 0);
      shard->step({torch::ones({layout.partition_numel}, torch::device(gpu).dtype(dtype))}, store,
                  1.0);
      const auto state = shard->state_for_save();
      EXPECT_TRUE(state[0].is_cuda());
      ASSERT_TRUE(state[1].defined());
      EXPECT_TRUE(state[1].is_cuda()) << "the moments";
      const at::Tensor stored = store.read_all();
      EXPECT_FALSE(torch::equal(stored, start)) << "the step did not reach the store";
      EXPECT_TRUE(torch::equal(stored, state[0].cpu().to(dtype)));
    }
  }
}

// offload_optimizer.pin_memory has its meaning: the host masters of a GPU partition are
// page-locked with it and pageable without, and both train the same.
TEST(OneGpuOffload, PinMemoryPagesLockTheHostMasters) {
  SKIP_WITHOUT_GPU();
  for (bool pin : {true, false}) {
    at::Tensor values = torch::randn({1000}, torch::device(torch::kCUDA).dtype(torch::kBFloat16));
    deepspeed::zero::TensorPartition partition(values);
    deepspeed::zero::ShardOptions options;
    options.home = deepspeed::zero::OffloadDevice::kCpu;
    options.pin_memory = pin;
    auto shard = deepspeed::zero::make_shard_optimizer(options, partition, [](std::vector<at::Tensor> p) {
      return std::make_shared<deepspeed::optim::FusedAdam>(std::move(p), deepspeed::AdamHyper{});
    });
    at::Tensor master = shard->state_for_save()[0];
    EXPECT_TRUE(master.is_cpu());
    EXPECT_EQ(master.is_pinned(), pin);
    shard->step({torch::ones({1000}, values.options())}, partition, 1.0);
    // The updated masters' bf16 rounding went up into the GPU partition.
    EXPECT_TRUE(torch::equal(values.cpu(), master.to(torch::kBFloat16)));
  }
}

// Device and host bytes apart: ZeRO-2 + CPU optimizer offload at world size 1 in bf16 keeps only
// the 16-bit parameters on the GPU (2Ψ, the ZeRO-Offload paper's figure) and the reduction
// buckets; in host memory the fp32 masters and moments (12Ψ), the bf16 gradient partition the
// buckets come down into (2Ψ) and the update's fp32 scratch and 4-slot bf16 upload ring
// (4c + 8c bytes, c = min(2^22, Ψ/4) elements), each within 5%.
TEST(OneGpuMemory, DeviceAndHostBytesFollowTheFormulas) {
  SKIP_WITHOUT_GPU();
  dstest::RunSpec spec = one_gpu_run(2);
  spec.config = config_for(2, true, Home::kOptimizerCpu, "");
  auto run = dstest::train_gpt(spec);
  const double psi = static_cast<double>(dstest::count_parameters(spec.model));
  const auto& m = run.memory[0];
  EXPECT_NEAR(static_cast<double>(m.parameters), 2 * psi, 0.05 * 2 * psi);
  EXPECT_EQ(m.device_bytes(), m.parameters + m.comm_buffers + m.gathered_bytes);
  // Buckets, not a partition: the pool of equal bf16 buffers, 2 in flight + 1 filling + 1 whose
  // gradient came early, each of at most reduce_bucket_size (2000) elements or the largest
  // parameter (256 x 32) alone, as tests/dist/zero_memory_test checks on the CPU. (This model is
  // small: Ψ itself is ~42k.)
  EXPECT_LE(m.comm_buffers, 4 * std::max(2000, 256 * 32) * 2);
  EXPECT_NEAR(static_cast<double>(m.gradients), 2 * psi, 0.05 * 2 * psi);
  EXPECT_EQ(m.host_bytes, m.optimizer_states + m.gradients);
  const double chunk = std::min(4194304.0, std::ceil(psi / 4));
  const double host = 14 * psi + 12 * chunk;
  EXPECT_NEAR(static_cast<double>(m.host_bytes), host, 0.05 * host);
  // The estimator's placement says the same (it leaves the update's bounded scratch and ring
  // out: 12 * chunk).
  deepspeed::ZeroMemoryOptions o;
  o.stage = 2;
  o.mixed_precision = true;
  o.gpu = true;
  o.offload_optimizer = "cpu";
  const auto e = deepspeed::estimate_zero_memory(dstest::count_parameters(spec.model), o);
  EXPECT_NEAR(static_cast<double>(m.host_bytes), e.host_bytes + 12 * chunk, 0.05 * host);
  EXPECT_NEAR(static_cast<double>(m.parameters), e.peak_device(), 0.05 * 2 * psi);
}

// Stage 3 never holds the whole model on the GPU at initialize(): the units' parameters stay in
// host memory until stage 3 moves each unit just before slicing it (runtime/module_placement.h).
// With parameters and optimizer offloaded the GPU then holds the parameters outside the units, one
// unit at a time and the buckets: the peak over initialize() (the model is built in host memory)
// stays well under the whole model's bytes, which moving the module first (as DeepSpeed does
// without zero.Init) puts on the GPU at once. 8 blocks of 49,984 parameters, 34k outside them.
// No parameter persists (config_for): with the default threshold every block parameter of this
// small model would stay whole in the root unit, and the root would be the whole model.
TEST(OneGpuMemory, Stage3InitializeHoldsOneUnitAtATime) {
  SKIP_WITHOUT_GPU();
  dstest::RunSpec spec = one_gpu_run(1);
  spec.model = gpt::GPTConfig{256, 16, 8, 2, 64};
  spec.config = config_for(3, false, Home::kParamAndOptimizerCpu, "");
  const c10::Device gpu(c10::kCUDA, 0);
  const int64_t before = deepspeed::device_memory(gpu).allocated;
  deepspeed::reset_device_memory_peaks(gpu);
  int64_t peak = -1;
  spec.before_training = [&](deepspeed::Engine&) {
    peak = deepspeed::device_memory(gpu).allocated_peak - before;
  };
  dstest::train_gpt(spec);
  const double whole = 4.0 * static_cast<double>(dstest::count_parameters(spec.model));  // fp32
  std::cout << "stage 3 initialize(): GPU peak " << peak << " bytes, the whole model " << whole
            << "\n";
  EXPECT_GT(peak, 0);
  EXPECT_LT(static_cast<double>(peak), 0.6 * whole);
}

// A model built under zero::Init trains on the GPU as the same model built whole (ZeRO-3, fp32,
// and with parameters offloaded): its slices are gathered onto the GPU unit by unit before stage
// 3 hooks the gradients (a unit gathered in host memory would lose its hooks when its parameters
// first moved to the GPU, and its gradients would never be reduced). No parameter persists
// (config_for), so the blocks' parameters are their units'.
TEST(OneGpuZeroInit, TrainsAsTheModelBuiltWhole) {
  SKIP_WITHOUT_GPU();
  const dstest::Deterministic deterministic;
  for (Home home : {Home::kNone, Home::kParamAndOptimizerCpu}) {
    dstest::RunSpec spec = one_gpu_run(6);
    spec.config = config_for(3, false, home, "");
    spec.zero_init = true;
    auto sliced = dstest::train_gpt(spec);
    spec.zero_init = false;
    spec.initial_weights = sliced.initial;
    auto whole = dstest::train_gpt(spec);
    const char* where = home == Home::kNone ? "no offload" : "param+optimizer offload";
    EXPECT_LE(dstest::max_loss_rel_diff(sliced, whole), dstest::kLossTol) << where;
    EXPECT_LE(dstest::max_weight_diff(sliced, whole), dstest::kWeightTol) << where;
    EXPECT_LT(sliced.losses.back(), sliced.losses.front()) << where;
  }
}

// Stage 3's fetch ahead and release on the GPU: with the defaults a small model's units are all
// prefetched from step 2 and kept until backward, so nothing is released after its forward, and
// no fetch runs beside a release. Here every unit is released as soon as its forward (and its
// backward) is done (reuse distance 0), at most two blocks are gathered at once, and the prefetch
// reaches one block ahead (the CPU suite's `prefetching()`): each fetch (on the side stream, from
// host memory with parameters offloaded) runs beside another unit's use and release, as in a
// model too big for the GPU. The peak gathered shows the prefetch happened (more than one block
// live) within the bound (at most two). It trains as stage 0 (within 1e-6 relative without
// offload, 1e-5 with the CPU Adam).
TEST(OneGpuStage3, PrefetchBesideReleaseTrainsAsStageZero) {
  SKIP_WITHOUT_GPU();
  const dstest::Deterministic deterministic;
  // A block of the test GPT (n_embd 32, with biases and layer norms): 12,704 elements, padded to
  // at most 12,736.
  constexpr int64_t kBlock = 12736;
  for (Home home : {Home::kNone, Home::kParamAndOptimizerCpu}) {
    dstest::RunSpec spec = one_gpu_run(12);
    spec.model.n_layer = 6;
    spec.config = config_for(0, false, Home::kNone, "");
    auto reference = dstest::train_gpt(spec);
    spec.config = config_for(3, false, home, "");
    auto& z = spec.config["zero_optimization"];
    z["stage3_max_reuse_distance"] = 0;
    z["stage3_max_live_parameters"] = 2 * kBlock;
    z["stage3_prefetch_bucket_size"] = kBlock;
    auto run = dstest::train_gpt(spec);
    const char* where = home == Home::kNone ? "no offload" : "param+optimizer offload";
    ASSERT_EQ(run.losses.size(), 12u) << where;
    ASSERT_EQ(run.memory.size(), 1u) << where;
    EXPECT_GT(run.memory[0].peak_gathered_numel, kBlock) << where << ": nothing was prefetched";
    EXPECT_LE(run.memory[0].peak_gathered_numel, 2 * kBlock) << where;
    EXPECT_LT(run.losses.back(), run.losses.front()) << where;
    EXPECT_LE(dstest::max_loss_rel_diff(run, reference), home == Home::kNone ? 1e-6 : 1e-5) << where;
  }
}

// Two ranks sharing the one GPU (NCCL refuses that; Gloo reduces CUDA tensors): every stage
// agrees with stage 0 at the same world size.
TEST(TwoRanksOneGpu, StagesAgreeOverGloo) {
  SKIP_WITHOUT_GPU();
  const dstest::Deterministic deterministic;
  auto reference = train_on_gpu(0, false, Home::kNone, 2);
  for (int stage = 1; stage <= 3; ++stage) {
    auto run = train_on_gpu(stage, false, Home::kNone, 2);
    EXPECT_LE(dstest::max_loss_rel_diff(run, reference), dstest::kLossTol) << "stage " << stage;
    EXPECT_LE(dstest::max_weight_diff(run, reference), dstest::kWeightTol) << "stage " << stage;
  }
  auto offloaded = train_on_gpu(2, false, Home::kOptimizerCpu, 2);
  EXPECT_LE(dstest::max_loss_rel_diff(offloaded, reference), 1e-5);
}

// A checkpoint saved on the GPU loads into a CPU run and back: the weights arrive bit for bit.
TEST(TwoRanksOneGpu, CheckpointMovesBetweenGpuAndCpu) {
  SKIP_WITHOUT_GPU();
  dstest::TempDir dir;
  const std::string gpu_ckpt = dir / "gpu", cpu_ckpt = dir / "cpu";
  dstest::RunSpec spec;
  spec.world_size = 2;
  spec.steps = 3;
  spec.config = config_for(2, false, Home::kNone, "");
  spec.device = "cuda";
  spec.after_training = [&](deepspeed::Engine& e) { e.save_checkpoint(gpu_ckpt); };
  auto on_gpu = dstest::train_gpt(spec);

  // Loaded on the CPU with no further step: the weights are the GPU run's, exactly.
  dstest::RunSpec cpu = spec;
  cpu.device = "cpu";
  cpu.steps = 0;
  cpu.before_training = [&](deepspeed::Engine& e) { e.load_checkpoint(gpu_ckpt); };
  cpu.after_training = [&](deepspeed::Engine& e) { e.save_checkpoint(cpu_ckpt); };
  auto on_cpu = dstest::train_gpt(cpu);
  EXPECT_EQ(dstest::max_weight_diff(on_cpu, on_gpu), 0.0);

  // And back onto the GPU from the CPU's checkpoint.
  dstest::RunSpec back = spec;
  back.steps = 0;
  back.before_training = [&](deepspeed::Engine& e) { e.load_checkpoint(cpu_ckpt); };
  back.after_training = nullptr;
  auto again = dstest::train_gpt(back);
  EXPECT_EQ(dstest::max_weight_diff(again, on_gpu), 0.0);
}

// NCCL's all-to-all (1-bit Adam's rows, qgZ) is NCCL's own, not the all-gather fallback: at
// world size 1 it hands a GPU tensor's chunks back in place, bf16 included, and a host tensor
// through the GPU; the counters see one all_to_all.
TEST(OneGpuNccl, AllToAllRunsOnNccl) {
  SKIP_WITHOUT_GPU();
  auto comm = deepspeed::comm::make_nccl_communicator_on(c10::make_intrusive<c10d::HashStore>(), 0,
                                                         1, 0, 0, std::chrono::seconds(60));
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kChar}) {
    at::Tensor in = torch::arange(12, torch::device(torch::kCUDA).dtype(at::kFloat)).to(dtype);
    at::Tensor out = torch::zeros_like(in);
    comm->all_to_all(out, in)->wait();
    EXPECT_TRUE(torch::equal(out.cpu(), in.cpu())) << c10::toString(dtype);
  }
  at::Tensor host_in = torch::arange(8, torch::kFloat), host_out = torch::zeros({8});
  comm->all_to_all(host_out, host_in)->wait();
  EXPECT_TRUE(torch::equal(host_out, host_in));
  const auto stats = comm->stats();
  EXPECT_EQ(stats.at("all_to_all").calls, 4);
  EXPECT_EQ(stats.count("all_gather"), 0u);
}

// While the comms_logger keeps latencies, an NCCL collective's latency is the host's wait for it
// (DeepSpeed's timed_op synchronizes), not its launch: the launch first waits for the work
// queued on the current stream before it (not the collective's), and wait() for the collective
// and what the stream queued meanwhile (the overlapped work, as on Gloo), so the latency is at
// least a kernel queued between the launch and wait(). Without the host waits, wait() returns
// while the kernel runs and the latency is the launch's, microseconds.
TEST(OneGpuNccl, KeptLatencyWaitsForTheCollective) {
  SKIP_WITHOUT_GPU();
#ifndef DS_WITH_CUDA
  GTEST_SKIP() << "this build has no CUDA code (DS_WITH_CUDA)";
#else
  auto comm = deepspeed::comm::make_nccl_communicator_on(c10::make_intrusive<c10d::HashStore>(), 0,
                                                         1, 0, 0, std::chrono::seconds(60));
  comm->keep_latencies();
  at::Tensor t = torch::ones({1024}, torch::device(torch::kCUDA));
  const auto stream = c10::cuda::getCurrentCUDAStream(0);
  const int64_t cycles = int64_t{1} << 29;  // ~0.3 s at the H200's ~2 GHz
  at::cuda::CUDAEvent queued_before(cudaEventDefault), start(cudaEventDefault),
      end(cudaEventDefault);
  at::cuda::sleep(cycles);
  queued_before.record(stream);
  auto work = comm->all_reduce(t);
  EXPECT_TRUE(queued_before.query()) << "the launch did not wait for the work queued before it";
  start.record(stream);
  at::cuda::sleep(cycles);
  end.record(stream);
  work->wait();
  EXPECT_TRUE(end.query()) << "wait() returned before the stream reached the collective";
  const double kernel_ms = start.elapsed_time(end);
  const auto stats = comm->stats();  // by value: a reference into the temporary would dangle
  const auto& s = stats.at("all_reduce").by_size.at(4096);
  ASSERT_EQ(s.latencies_ms.size(), 1u);
  EXPECT_GE(s.latencies_ms[0], kernel_ms) << "the latency kept is the launch's";
  EXPECT_TRUE(torch::equal(t.cpu(), torch::ones({1024})));
#endif
}

// More than the GPU may hold: a DeepSpeed error naming the phase, the bytes and what to try,
// not a raw CUDA stack.
// The gradient norm on a GPU reads each chunk once with fp32 accumulation (tensor_facts.cpp):
// it agrees with the CPU's fp64 sum within 1e-6 relative, over several chunks (2^24 elements
// each) and for fp32, bf16 and fp16 gradients; inf stays inf and NaN stays NaN.
TEST(OneGpuNorm, SumOfSquaresAgreesWithTheFp64One) {
  SKIP_WITHOUT_GPU();
  const int64_t n = (int64_t{1} << 25) + 12345;  // two whole chunks and a part
  const at::Tensor g = torch::randn({n}, at::TensorOptions().dtype(at::kFloat)) * 1e-2;
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    const at::Tensor host = g.to(dtype);
    const double want = deepspeed::zero::sum_of_squares(host).item<double>();
    const double got = deepspeed::zero::sum_of_squares(host.to(torch::kCUDA)).item<double>();
    EXPECT_NEAR(got, want, 1e-6 * want) << c10::toString(dtype);
  }
  at::Tensor bad = torch::ones({1000}, torch::kCUDA);
  bad[7] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(deepspeed::zero::sum_of_squares(bad).item<double>()));
  bad[9] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(deepspeed::zero::sum_of_squares(bad).item<double>()));
}

TEST(OneGpuMemory, OutOfMemoryIsReportedInWords) {
  SKIP_WITHOUT_GPU();
  deepspeed::cap_device_memory(c10::Device(c10::kCUDA, 0), 256LL << 20);
  dstest::RunSpec spec = one_gpu_run(1);
  spec.model = gpt::GPTConfig{256, 64, 4, 4, 1024};  // ~50M parameters: 0.8 GB of Adam state
  spec.config = config_for(1, false, Home::kNone, "");
  try {
    dstest::train_gpt(spec);
    deepspeed::cap_device_memory(c10::Device(c10::kCUDA, 0), deepspeed::device_memory(c10::Device(c10::kCUDA, 0)).total);
    FAIL() << "training within a 256 MiB cap did not run out of memory";
  } catch (const std::exception& e) {
    deepspeed::cap_device_memory(c10::Device(c10::kCUDA, 0), deepspeed::device_memory(c10::Device(c10::kCUDA, 0)).total);
    const std::string what = e.what();
    EXPECT_CONTAINS(what, "out of GPU memory");
    EXPECT_CONTAINS(what, "zero stage 1");
    EXPECT_CONTAINS(what, "offload");
    EXPECT_EQ(what.find("frame #"), std::string::npos) << what;
  }
}

}  // namespace

// FusedAdam's segment-by-segment step on the GPU (device_adam_step over narrowed views of the
// master, moments and, in bf16, the 16-bit copy): at stage 2 a group at lr 0 keeps its
// parameters bit for bit while the other trains, and in fp32 the groups step as stage 0 does.
TEST(OneGpuParamGroups, FusedAdamStepsEachGroupOnTheGpu) {
  SKIP_WITHOUT_GPU();
  const dstest::Deterministic deterministic;
  for (bool bf16 : {false, true}) {
    auto spec = one_gpu_run(6);
    spec.config = config_for(2, bf16, Home::kNone, "");
    spec.config.erase("optimizer");
    spec.client_optimizer = [](gpt::GPTImpl& m) { return dstest::two_group_fused_adam(m, 0.0); };
    auto r = dstest::train_gpt(spec);
    ASSERT_EQ(r.weights.size(), r.initial.size());
    const dstest::Moved moved = dstest::moved_by_group(r);
    EXPECT_EQ(moved.vectors, 0.0) << (bf16 ? "bf16" : "fp32");
    EXPECT_GT(moved.matrices, 0.0) << (bf16 ? "bf16" : "fp32");
  }
  auto grouped = [](int stage) {
    auto spec = one_gpu_run(6);
    spec.config = config_for(stage, false, Home::kNone, "");
    spec.config.erase("optimizer");
    spec.client_optimizer = [](gpt::GPTImpl& m) { return dstest::two_group_fused_adam(m, 1e-3); };
    return dstest::train_gpt(spec);
  };
  EXPECT_LE(dstest::max_loss_rel_diff(grouped(2), grouped(0)), 1e-6);
}

// ZeRO-Offload on a GPU with a client's two groups: the AdamW runs as the CPU Adam, which with
// the partition on the GPU updates range by range (overlap_step, on by default here) and uploads
// each range through the ring (AdamRangeStep::run_into), each range cut where the groups'
// segments meet. At stage 2 it trains as stage 0 in fp32 steps the module's parameters group by
// group on the GPU (within the CPU Adam's tolerance, as OneGpu.TrainsAsStageZero), ranges were
// taken during backward, and a group at lr 0 keeps its parameters bit for bit.
TEST(OneGpuParamGroups, CpuOffloadStepsEachGroupRangeByRange) {
  SKIP_WITHOUT_GPU();
  const dstest::Deterministic deterministic;
  auto grouped = [](int stage, double vector_lr, size_t* ranges) {
    auto spec = one_gpu_run(6);
    spec.config = config_for(stage, false, stage == 0 ? Home::kNone : Home::kOptimizerCpu, "");
    spec.config.erase("optimizer");
    spec.client_optimizer = [vector_lr](gpt::GPTImpl& m) {
      return dstest::two_group_adamw(m, vector_lr);
    };
    if (ranges)
      spec.after_training = [ranges](deepspeed::Engine& engine) {
        *ranges = deepspeed::state_of(engine).stage->ranges_stepped_during_backward();
      };
    return dstest::train_gpt(spec);
  };
  size_t ranges = 0;
  auto offloaded = grouped(2, 1e-3, &ranges);
  auto reference = grouped(0, 1e-3, nullptr);
  EXPECT_GT(ranges, 0u) << "no range updated during backward (overlap_step off?)";
  EXPECT_LE(dstest::max_loss_rel_diff(offloaded, reference), 1e-5);
  EXPECT_LT(dstest::max_weight_diff(offloaded, reference), dstest::kWeightTol);
  auto r = grouped(2, 0.0, nullptr);
  ASSERT_EQ(r.weights.size(), r.initial.size());
  const dstest::Moved moved = dstest::moved_by_group(r);
  EXPECT_EQ(moved.vectors, 0.0);
  EXPECT_GT(moved.matrices, 0.0);
}

namespace {
// The example GPT with dropout on the GPU at world size 1 (NCCL), three micro-steps a step, ZeRO-2:
// trains until micro_steps() reaches `until`, saving tag "m<N>" whenever micro_steps() reaches an
// N of `save_at`; first loads `load_tag` from `dir` when it is given. Micro-step -> its loss.
std::map<int64_t, double> train_with_dropout_on_gpu(const std::string& dir, int64_t until,
                                                    const std::vector<int64_t>& save_at,
                                                    const std::string& load_tag,
                                                    uint64_t model_seed) {
  gpt::GPTConfig m{256, 16, 1, 2, 16};
  m.dropout = 0.3;
  torch::manual_seed(model_seed);
  auto model = std::make_shared<gpt::GPTImpl>(m);
  // Seeds the CPU's and every GPU's generator alike in both jobs: a resumed job's masks differ
  // unless the checkpoint's generator states replace these.
  torch::manual_seed(99);
  auto r = deepspeed::initialize<gpt::GPTImpl>(
      {.model = model,
       .config_json = dstest::base_config(2, 3, 2),
       .training_data = dstest::test_text_dataset(m.block_size),
       .comm = deepspeed::comm::make_nccl_communicator_on(
           c10::make_intrusive<c10d::HashStore>(), 0, 1, 0, 0, std::chrono::seconds(60)),
       .device = "cuda"});
  if (!load_tag.empty()) r.engine->load_checkpoint(dir, load_tag);
  std::map<int64_t, double> losses;
  while (r.engine->micro_steps() < until) {
    const int64_t micro = r.engine->micro_steps();
    auto batch = r.training_dataloader->next();
    auto loss = r.engine->forward(batch.data, batch.target);
    losses[micro] = loss.item<double>();
    r.engine->backward(loss);
    r.engine->step();
    for (int64_t at : save_at)
      if (r.engine->micro_steps() == at) r.engine->save_checkpoint(dir, "m" + std::to_string(at));
  }
  return losses;
}
}  // namespace

// Dropout draws its masks from the GPU's generator, which the checkpoint saves
// ("cuda_rng_state"): resumed from a save between boundaries (micro-step 5 of steps of 3: the
// resumed job trains micro-steps 3 and 4 again) and from one at a boundary (6), the losses are the
// uninterrupted job's bit for bit.
TEST(OneGpuCheckpoint, DropoutMasksResumeBitForBit) {
  SKIP_WITHOUT_GPU();
  const dstest::Deterministic deterministic;
  dstest::TempDir dir;
  const auto whole = train_with_dropout_on_gpu(dir.path(), 12, {5, 6}, "", 7);
  ASSERT_EQ(whole.size(), 12u);
  for (int64_t saved : {5, 6}) {
    const std::string tag = "m" + std::to_string(saved);
    deepspeed::checkpoint::TagReader reader(deepspeed::checkpoint::posix_file_system(),
                                            dir / tag);
    EXPECT_NE(reader.file(reader.partition_file(0)).find("cuda_rng_state"), nullptr) << tag;
    const auto again = train_with_dropout_on_gpu(dir.path(), 12, {}, tag, 4242);
    const int64_t boundary = saved / 3 * 3;
    ASSERT_EQ(again.size(), static_cast<size_t>(12 - boundary)) << tag;
    for (const auto& [micro, loss] : again)
      EXPECT_EQ(loss, whole.at(micro)) << tag << ", micro-step " << micro;
  }
}

// Lion on the GPU is tensor operations (optim/lion.h): three steps on CUDA tensors give the host
// pass's parameters and momentum bit for bit (each product and sum rounded once, in the same
// order, on both); then stages 1-3 on the GPU train as stage 0 with it: losses within 1e-4
// relative, not weights (other kernels per layout can flip the sign of a c near 0, moving that
// weight by 2·lr; a wrong update moves the losses).
TEST(OneGpuLion, StepEqualsTheHostPassAndStagesTrainAsStageZero) {
  SKIP_WITHOUT_GPU();
  const dstest::Deterministic deterministic;
  deepspeed::optim::LionHyper h;
  h.lr = 0.003;
  h.beta2 = 0.98;
  h.weight_decay = 0.2;
  torch::manual_seed(4);
  const torch::Tensor start = torch::randn({4099});
  std::vector<torch::Tensor> grads;
  for (int t = 0; t < 3; ++t) grads.push_back(torch::randn({4099}) * 0.1);
  std::vector<torch::Tensor> after;  // [host p, host m, gpu p, gpu m]
  for (const char* device : {"cpu", "cuda"}) {
    torch::Tensor p = start.clone().to(device).requires_grad_();  // not `start` itself on the CPU
    deepspeed::optim::Lion opt({p}, h);
    for (const auto& g : grads) {
      p.mutable_grad() = g.to(device);
      opt.step();
    }
    const auto& s = static_cast<deepspeed::optim::LionParamState&>(
        *opt.state().begin()->second);
    after.push_back(p.detach().cpu());
    after.push_back(s.exp_avg().cpu());
  }
  EXPECT_TRUE(torch::equal(after[0], after[2])) << (after[0] - after[2]).abs().max();
  EXPECT_TRUE(torch::equal(after[1], after[3])) << (after[1] - after[3]).abs().max();

  auto lion_run = [](int stage) {
    dstest::RunSpec spec = one_gpu_run(10);
    spec.config = dstest::base_config(2, 1, stage);
    spec.config["optimizer"] = {{"type", "Lion"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.1}}}};
    return dstest::train_gpt(spec);
  };
  const auto reference = lion_run(0);
  EXPECT_LT(dstest::tail_mean(reference.losses, 3), reference.losses.front() - 0.3);  // it trains
  for (int stage : {1, 2, 3}) {
    const auto run = lion_run(stage);
    EXPECT_LE(dstest::max_loss_rel_diff(run, reference), 1e-4) << "stage " << stage;
  }
}

// Low-precision masters on the GPU (bf16.bf16_master_weights_and_grads): the 16-bit partition on
// the GPU is the master (bf16 moments, no offload: the GPU Adam on widened copies, also with
// libtorch's kernel, whose 16-bit gradients are widened with them), or a bf16 host copy beside it
// (CPU offload at stage 2, the CPU Adam during backward, uploads straight from it), or stage 3's
// offloaded partition in host memory itself. Each first update is the fp32-master run's bit for
// bit in the same home, the optimizer holds the bytes the estimator gives, and training goes on.
// Optimizer bytes at world size 1 (P the partition, ~Ψ; c = min(2^22, ceil(P/4)) the CPU Adam's
// chunk): fp32 masters 12P, plus under offload the fp32 gradient scratch 4c and at stage 2 the
// bf16 upload ring 8c (zero/step_during_backward.cpp); bf16 masters 4P (bf16 moments, on the
// GPU), 8P beside stage 3's host partition (fp32 moments), 10P / 6P as stage 2's host copy, plus
// the scratch 4c under offload (no ring: the pinned bf16 masters go up as they are).
TEST(OneGpuLowPrecision, FirstStepAsFp32MastersEstimatedBytesAndTrains) {
  SKIP_WITHOUT_GPU();
  const dstest::Deterministic deterministic;
  struct Variant {
    int stage;
    Home home;
    bool bf16_moments;
    bool libtorch_adam = false;  // DS_DEVICE_ADAM=libtorch
  };
  for (const Variant v : {Variant{2, Home::kNone, true}, Variant{3, Home::kNone, true},
                          Variant{2, Home::kNone, true, true},
                          Variant{2, Home::kOptimizerCpu, false},
                          Variant{2, Home::kOptimizerCpu, true},
                          Variant{3, Home::kParamAndOptimizerCpu, false}}) {
    const std::string where = "stage " + std::to_string(v.stage) + " " + name_of(v.home) +
                              (v.bf16_moments ? " bf16 moments" : " fp32 moments") +
                              (v.libtorch_adam ? " libtorch Adam" : "");
    const dstest::ScopedEnv adam_choice("DS_DEVICE_ADAM");
    if (v.libtorch_adam) setenv("DS_DEVICE_ADAM", "libtorch", 1);
    dstest::RunSpec base = one_gpu_run(1);
    auto run = [&](bool low, int steps) {
      dstest::RunSpec spec = one_gpu_run(steps);
      spec.config = config_for(v.stage, /*bf16=*/true, v.home, "");
      if (low) {
        spec.config["bf16"]["bf16_master_weights_and_grads"] = true;
        spec.config["bf16"]["bf16_optimizer_states"] = v.bf16_moments;
      }
      return dstest::train_gpt(spec);
    };
    const auto fp32 = run(false, 1), low = run(true, 1);
    for (size_t i = 0; i < fp32.weights.size(); ++i)
      EXPECT_TRUE(torch::equal(low.weights[i], fp32.weights[i])) << where << " parameter " << i;

    const int64_t psi = dstest::count_parameters(base.model);
    const bool offload = v.home != Home::kNone;
    const double chunk = std::min(4194304.0, std::ceil(psi / 4.0));
    const double scratch = offload ? 4 * chunk : 0;
    const double ring = v.stage == 2 && offload ? 8 * chunk : 0;
    const double fp32_expected = 12.0 * psi + scratch + ring;
    EXPECT_NEAR(static_cast<double>(fp32.memory[0].optimizer_states), fp32_expected,
                0.05 * fp32_expected)
        << where << ": fp32 masters";
    deepspeed::ZeroMemoryOptions o;
    o.stage = v.stage;
    o.mixed_precision = true;
    o.gpu = true;
    o.low_precision_masters = true;
    o.bf16_moments = v.bf16_moments;
    o.offload_optimizer = offload ? "cpu" : "none";
    o.offload_param = v.home == Home::kParamAndOptimizerCpu ? "cpu" : "none";
    const auto e = deepspeed::estimate_zero_memory(psi, o);
    const int master = v.stage == 2 && offload ? 2 : 0;  // stage 2's host copy
    EXPECT_EQ(e.optimizer_states, (master + (v.bf16_moments ? 4 : 8)) * psi) << where;
    const double low_expected = static_cast<double>(e.optimizer_states) + scratch;
    EXPECT_NEAR(static_cast<double>(low.memory[0].optimizer_states), low_expected,
                0.05 * low_expected)
        << where << ": bf16 masters";
    EXPECT_LT(low.memory[0].optimizer_states, fp32.memory[0].optimizer_states) << where;
    const auto longer = run(true, 10);
    EXPECT_LT(longer.losses.back(), longer.losses.front()) << where << ": the loss did not fall";
  }
}
