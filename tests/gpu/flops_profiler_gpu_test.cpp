// The flops profiler on a GPU (label gpu): kernels run after their launch returns, so a module's
// latency must include them (the profiler synchronizes the device around each top-level operator,
// as DeepSpeed's module hooks do). Skips, saying why, without a GPU.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <chrono>

#include "deepspeed/flops_profiler.h"
#include "support/gpu_skip.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One Linear of 8192×8192 on [16384, 8192] in fp32: 2.2 TFLOP, tens of milliseconds of kernel
// against microseconds of launch. Without the synchronize the profiled duration is the launch's
// (a small fraction of the forward); with it, about the forward itself. Half leaves room for
// clock noise either way.
TEST(FlopsProfilerGpu, LatencyIncludesTheKernels) {
  SKIP_WITHOUT_GPU();
  torch::NoGradGuard no_grad;
  const torch::Device gpu(torch::kCUDA, 0);
  torch::nn::Linear lin(torch::nn::LinearOptions(8192, 8192));
  lin->to(gpu);
  const auto x = torch::randn({16384, 8192}, torch::TensorOptions().device(gpu));
  lin->forward(x);  // cuBLAS's first call initialises it: not what is timed
  torch::cuda::synchronize();

  const auto t0 = std::chrono::steady_clock::now();
  lin->forward(x);
  torch::cuda::synchronize();
  const double forward_s = seconds_since(t0);

  deepspeed::profiling::FlopsProfiler prof(lin.ptr());
  prof.start_profile();
  lin->forward(x);
  prof.stop_profile();
  torch::cuda::synchronize();
  EXPECT_EQ(prof.get_total_macs(), int64_t{16384} * 8192 * 8192);
  EXPECT_GT(prof.get_total_duration(), 0.5 * forward_s)
      << "profiled " << prof.get_total_duration() << " s against a synchronized forward of "
      << forward_s << " s: the profile timed the kernel launch, not the kernel";
}

}  // namespace
