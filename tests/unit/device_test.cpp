// What of the GPU path runs on any machine: the device and backend choice, their errors, and the
// device Adam's formula (it runs on CPU tensors as well).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include "comm/nccl_communicator.h"
#include "deepspeed/comm.h"
#include "deepspeed/device.h"
#include "deepspeed/errors.h"
#include "optim/cpu_adam.h"
#include "optim/device_adam.h"
#include "support/expect.h"
#include "support/scoped_env.h"

namespace device_test {

namespace {


std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Device, ExplicitCpuWinsOverTheEnvironment) {
  dstest::ScopedEnv g("DS_DEVICE");
  setenv("DS_DEVICE", "cuda", 1);
  EXPECT_EQ(deepspeed::resolve_device("cpu", 0), c10::Device(c10::kCPU));
}

TEST(Device, AutoFollowsTheEnvironmentThenTheMachine) {
  dstest::ScopedEnv g("DS_DEVICE");
  setenv("DS_DEVICE", "cpu", 1);
  EXPECT_EQ(deepspeed::resolve_device("auto", 3), c10::Device(c10::kCPU));
  unsetenv("DS_DEVICE");
  const c10::Device d = deepspeed::resolve_device("auto", 0);
  EXPECT_EQ(d.is_cuda(), deepspeed::cuda_available());
}

TEST(Device, UnknownValuesAreNamed) {
  dstest::ScopedEnv g("DS_DEVICE");
  unsetenv("DS_DEVICE");
  EXPECT_CONTAINS(error_of([] { deepspeed::resolve_device("gpu0", 0); }), "device \"gpu0\"");
  EXPECT_CONTAINS(error_of([] { deepspeed::resolve_device("cuda:x", 0); }), "\"cuda:N\"");
  setenv("DS_DEVICE", "tpu", 1);
  EXPECT_CONTAINS(error_of([] { deepspeed::resolve_device("auto", 0); }), "(from DS_DEVICE)");
}

TEST(Device, AGpuThatIsNotThereIsNamed) {
  const std::string e = error_of([] { deepspeed::resolve_device("cuda:7", 0); });
  if (deepspeed::cuda_device_count() > 7) GTEST_SKIP() << "this machine has 8 GPUs";
  EXPECT_CONTAINS(e, "cuda:7");
  if (!deepspeed::cuda_available()) {
    EXPECT_CONTAINS(e, "no GPU is available");
  }
}

TEST(Device, CpuHasNoDeviceMemoryAndNoCap) {
  const auto m = deepspeed::device_memory(c10::kCPU);
  EXPECT_EQ(m.allocated_peak, 0);
  EXPECT_EQ(m.total, 0);
  EXPECT_CONTAINS(error_of([] { deepspeed::cap_device_memory(c10::kCPU, 1 << 20); }),
                  "needs a");
}

TEST(Backend, NcclWithoutCudaIsRefusedNamingTheWayOut) {
  if (deepspeed::comm::nccl_built()) GTEST_SKIP() << "this build has NCCL (tests/gpu cover it)";
  EXPECT_CONTAINS(error_of([] {
                    deepspeed::comm::make_nccl_communicator_on(c10::make_intrusive<c10d::HashStore>(), 0, 2, 0, 0,
                                                               std::chrono::seconds(1));
                  }),
                  "DS_COMM_BACKEND=gloo");
}

TEST(Backend, AnUnknownBackendIsNamed) {
  dstest::ScopedEnv g("DS_COMM_BACKEND");
  setenv("DS_COMM_BACKEND", "mpi", 1);
  deepspeed::comm::ProcessInfo info;
  info.world_size = 2;
  deepspeed::comm::InitOptions options;
  options.backend = "ucc";  // checked before the rendezvous, which would wait for rank 1
  options.timeout = std::chrono::milliseconds(200);
  EXPECT_CONTAINS(error_of([&] { deepspeed::comm::init_from_process_info(info, options); }),
                  "\"ucc\"");
  options.backend = "auto";  // then the environment's value is the one named
  EXPECT_CONTAINS(error_of([&] { deepspeed::comm::init_from_process_info(info, options); }),
                  "\"mpi\"");
}

// The device Adam (tensor operations, or libtorch 2.x's fused kernel) computes what the CPU
// kernel computes, to float rounding, for AdamW and Adam, with and without a gradient scale.
TEST(DeviceAdam, MatchesTheCpuKernel) {
  torch::manual_seed(3);
  for (bool adamw : {true, false}) {
    for (float scale : {1.0f, 0.25f}) {
      const int64_t n = 1000;
      auto p = torch::randn({n}), g = torch::randn({n}), m = torch::randn({n}) * 0.1,
           v = torch::rand({n}) * 0.01;
      auto p2 = p.clone(), m2 = m.clone(), v2 = v.clone();
      auto half = torch::empty({n}, torch::kBFloat16);
      deepspeed::optim::AdamStepParams hp;
      hp.lr = 1e-2f;
      hp.weight_decay = 0.1f;
      hp.adamw_mode = adamw;
      hp.step = 5;
      hp.grad_scale = scale;
      deepspeed::optim::adam_step(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(),
                                  v.data_ptr<float>(), n, hp);
      auto p3 = p2.clone(), m3 = m2.clone(), v3 = v2.clone(), g3 = g.clone();
      const auto g_before = g.clone();
      deepspeed::optim::device_adam_step(p2, g, m2, v2, hp, half);
      EXPECT_LE((p - p2).abs().max().item<double>(), 1e-6) << "adamw " << adamw << " scale " << scale;
      EXPECT_LE((m - m2).abs().max().item<double>(), 1e-6);
      EXPECT_LE((v - v2).abs().max().item<double>(), 1e-7);
      EXPECT_TRUE(torch::equal(half, p2.to(torch::kBFloat16))) << "the 16-bit copy";
      EXPECT_TRUE(torch::equal(g, g_before)) << "a gradient the caller keeps is not modified";
      // A scratch gradient may be scaled in place: the update is the same.
      deepspeed::optim::device_adam_step(p3, g3, m3, v3, hp, at::Tensor(),
                                         /*grad_is_scratch=*/true);
      EXPECT_TRUE(torch::equal(p3, p2) && torch::equal(m3, m2) && torch::equal(v3, v2));
    }
  }
}

// A 16-bit master on a device (bf16_master_weights_and_grads without offload) is stepped chunk by
// chunk on widened copies: with 16-bit gradients where the kernel cannot read them (libtorch's
// kernel, the tensor formula: here on CPU tensors, as on a GPU under DS_DEVICE_ADAM=libtorch)
// they are widened with their chunk instead of refused. Each variant is the widened fp32 update
// rounded back, whatever the chunk (several chunks and a part, or one), and the optional 16-bit
// target receives the rounded master.
TEST(DeviceAdam, SixteenBitMasterStepsInChunksOnWidenedCopies) {
  const dstest::ScopedEnv guard("DS_DEVICE_ADAM");
  setenv("DS_DEVICE_ADAM", "libtorch", 1);
  torch::manual_seed(4);
  const int64_t n = 1000;
  deepspeed::optim::AdamStepParams hp;
  hp.lr = 1e-2f;
  hp.weight_decay = 0.1f;
  hp.step = 3;
  hp.grad_scale = 0.5f;
  for (auto moments : {torch::kFloat, torch::kBFloat16}) {
    SCOPED_TRACE(moments == torch::kFloat ? "fp32 moments" : "bf16 moments");
    const auto p = torch::randn({n}).to(torch::kBFloat16);
    const auto g = torch::randn({n}).to(torch::kBFloat16);
    const auto m = (torch::randn({n}) * 0.1).to(moments), v = (torch::rand({n}) * 0.01).to(moments);
    // The reference: the whole partition widened, one fp32 step, rounded back.
    // (clone: to(kFloat) of fp32 moments is the moments themselves.)
    auto p32 = p.to(torch::kFloat), m32 = m.to(torch::kFloat).clone(),
         v32 = v.to(torch::kFloat).clone();
    deepspeed::optim::device_adam_step(p32, g.to(torch::kFloat), m32, v32, hp, at::Tensor());
    for (int64_t chunk : {int64_t{300}, int64_t{1} << 24}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk));
      auto p16 = p.clone(), m_ = m.clone(), v_ = v.clone();
      const auto g_before = g.clone();
      auto target = torch::empty({n}, torch::kBFloat16);
      deepspeed::optim::device_adam_step_any_master(p16, g, m_, v_, hp, target,
                                                    /*grad_is_scratch=*/false, chunk);
      EXPECT_TRUE(torch::equal(g, g_before)) << "the caller's gradients are not modified";
      EXPECT_EQ(p16.scalar_type(), torch::kBFloat16);
      EXPECT_EQ(m_.scalar_type(), moments);
      // Elementwise arithmetic: the chunks change nothing but which copy holds an element (at
      // most a 16-bit rounding step apart, should a vectorised tail round differently).
      EXPECT_LE((p16.to(torch::kFloat) - p32.to(torch::kBFloat16).to(torch::kFloat))
                    .abs()
                    .max()
                    .item<double>(),
                p32.abs().max().item<double>() / 128);
      EXPECT_LE(
          (m_.to(torch::kFloat) - m32.to(moments).to(torch::kFloat)).abs().max().item<double>(),
          1e-6 + m32.abs().max().item<double>() / 128 * (moments == torch::kFloat ? 0 : 1));
      EXPECT_LE(
          (v_.to(torch::kFloat) - v32.to(moments).to(torch::kFloat)).abs().max().item<double>(),
          1e-7 + v32.abs().max().item<double>() / 128 * (moments == torch::kFloat ? 0 : 1));
      EXPECT_TRUE(torch::equal(target, p16)) << "the 16-bit target holds the updated master";
    }
  }
}

// DS_DEVICE_ADAM chooses the GPU Adam: this library's kernel (the default, where built) or
// libtorch's ("libtorch"); another value is refused naming the variable and both choices. (A CPU
// build has no kernel: the default reads as false there, true in a CUDA build.)
TEST(DeviceAdam, TheEnvironmentChoosesTheKernel) {
  const dstest::ScopedEnv guard("DS_DEVICE_ADAM");
  unsetenv("DS_DEVICE_ADAM");
  const bool built = deepspeed::optim::device_adam_reads_16bit_grads();
  setenv("DS_DEVICE_ADAM", "deepspeed", 1);
  EXPECT_EQ(deepspeed::optim::device_adam_reads_16bit_grads(), built);
  setenv("DS_DEVICE_ADAM", "libtorch", 1);
  EXPECT_FALSE(deepspeed::optim::device_adam_reads_16bit_grads());
  setenv("DS_DEVICE_ADAM", "fused", 1);
  const std::string error = error_of([] { deepspeed::optim::device_adam_reads_16bit_grads(); });
  EXPECT_CONTAINS(error, "DS_DEVICE_ADAM='fused'");
  EXPECT_CONTAINS(error, "deepspeed");
  EXPECT_CONTAINS(error, "libtorch");
}

}  // namespace

}  // namespace device_test
