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
