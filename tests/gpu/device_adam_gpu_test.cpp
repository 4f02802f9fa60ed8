// deepspeed.cpp's GPU Adam kernel (label gpu; optim/device_adam_kernel.h): it equals the CPU
// kernel bit for bit for every gradient format, 16-bit copy, hyperparameter set and alignment;
// so ZeRO-Offload's CPU Adam and the GPU's train the same bf16 model bit for bit; and the mixed-
// precision step reads the 16-bit gradients without a widened fp32 copy. Skips, saying why,
// without a GPU or in a build without the kernel (a CPU libtorch).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "deepspeed/device.h"
#include "deepspeed/engine.h"
#include "optim/cpu_adam.h"
#include "optim/device_adam.h"
#include "support/deterministic.h"
#include "support/gpu_skip.h"
#include "support/scoped_env.h"
#include "support/training_run.h"

namespace device_adam_gpu_test {

using deepspeed::optim::AdamStepParams;
using deepspeed::optim::Half16Kind;

#define SKIP_WITHOUT_KERNEL()                                                                   \
  do {                                                                                          \
    SKIP_WITHOUT_GPU();                                                                         \
    if (!deepspeed::optim::device_adam_kernel_built()) {                                        \
      if (dstest::gpu_expected())                                                               \
        GTEST_FAIL() << "DS_EXPECT_GPU is set but this build has no GPU Adam kernel (not a "     \
                        "CUDA build): the kernel was not tested";                                 \
      GTEST_SKIP() << "this build has no GPU Adam kernel (not a CUDA build)";                   \
    }                                                                                           \
  } while (0)

// The kernel's tests run it whatever DS_DEVICE_ADAM chose for the rest of the program.
constexpr const char* kAdamChoice = "DS_DEVICE_ADAM";

struct Hyper {
  std::string name;
  AdamStepParams p;
};

std::vector<Hyper> hypers() {
  AdamStepParams adamw;
  adamw.lr = 1e-3f;
  adamw.weight_decay = 0.1f;
  adamw.step = 3;
  AdamStepParams l2 = adamw;
  l2.adamw_mode = false;
  l2.weight_decay = 0.01f;
  AdamStepParams uncorrected = adamw;
  uncorrected.bias_correction = false;
  uncorrected.weight_decay = 0.0f;
  AdamStepParams scaled = adamw;  // an fp16 loss scale's reciprocal, a late step, beta2 0.95
  scaled.grad_scale = 1.0f / 1024;
  scaled.step = 1000;
  scaled.beta2 = 0.95f;
  return {{"adamw", adamw}, {"adam_l2", l2}, {"no_bias_correction", uncorrected},
          {"grad_scale", scaled}};
}

// n elements; the master, moments and 16-bit copy start `offset` elements into their buffers,
// the gradients `grad_offset` into theirs.
struct Layout {
  int64_t n, offset, grad_offset;
};
std::string name_of(const Layout& l) {
  return "n=" + std::to_string(l.n) + " offset=" + std::to_string(l.offset) + "/" +
         std::to_string(l.grad_offset);
}

// A view of n elements `offset` into a fresh GPU buffer, holding `values`.
at::Tensor on_gpu_at(const at::Tensor& values, int64_t offset) {
  at::Tensor base = torch::zeros({values.numel() + offset}, values.options().device(torch::kCUDA));
  at::Tensor view = base.narrow(0, offset, values.numel());
  view.copy_(values);
  return view;
}

// Element for element the same bits (NaN payloads and the sign of zero included).
void expect_same_bits(const at::Tensor& gpu, const at::Tensor& cpu, const std::string& what) {
  const auto as = cpu.element_size() == 4 ? at::kInt : at::kShort;
  const at::Tensor a = gpu.cpu().contiguous().view(as), b = cpu.contiguous().view(as);
  const int64_t differ = a.ne(b).sum().item<int64_t>();
  EXPECT_EQ(differ, 0) << what << ": " << differ << " of " << b.numel() << " elements differ";
}

// The kernel against adam_step (cpu_adam.h) on the same finite values: the master, the moments
// and the 16-bit copy bit for bit, the gradient untouched, for fp32/bf16/fp16 gradients, no/bf16/fp16 copy, four hyperparameter
// sets, and layouts that take the 4-wide path with loose elements before and after it, and the
// one-by-one path (gradients misaligned against the master).
TEST(GpuAdamKernel, EqualsTheCpuKernelBitForBit) {
  SKIP_WITHOUT_KERNEL();
  const dstest::ScopedEnv kernel(kAdamChoice, nullptr);
  torch::manual_seed(11);
  const std::vector<Layout> layouts = {
      {(int64_t{1} << 20) + 5, 0, 0}, {4099, 3, 3}, {37, 1, 0}, {3, 0, 0}};
  for (const Layout& layout : layouts) {
    const int64_t n = layout.n;
    const at::Tensor master0 = torch::randn({n});
    at::Tensor m0 = torch::randn({n}) * 1e-2;
    at::Tensor v0 = torch::rand({n}) * 1e-4;
    m0[0] = 0.0f;  // a fresh element: no history, a zero gradient
    v0[0] = 0.0f;
    at::Tensor g0 = torch::randn({n}) * 1e-2;
    g0[0] = 0.0f;
    for (auto grad_dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      const at::Tensor grad = g0.to(grad_dtype);
      const at::Tensor grad32 = grad.to(at::kFloat);  // exact
      for (auto half_dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {  // kFloat: no copy
        const bool with_half = half_dtype != at::kFloat;
        const Half16Kind kind = half_dtype == at::kHalf ? Half16Kind::FP16 : Half16Kind::BF16;
        for (const Hyper& h : hypers()) {
          const std::string what = name_of(layout) + " grad " + c10::toString(grad_dtype) +
                                   " copy " + (with_half ? c10::toString(half_dtype) : "none") +
                                   " " + h.name;
          at::Tensor master = master0.clone(), m = m0.clone(), v = v0.clone();
          at::Tensor half = with_half ? torch::zeros({n}, at::kShort) : at::Tensor();
          deepspeed::optim::adam_step(
              master.data_ptr<float>(), grad32.data_ptr<float>(), m.data_ptr<float>(),
              v.data_ptr<float>(), n, h.p,
              with_half ? reinterpret_cast<uint16_t*>(half.data_ptr<int16_t>()) : nullptr, kind);

          at::Tensor d_master = on_gpu_at(master0, layout.offset);
          at::Tensor d_m = on_gpu_at(m0, layout.offset), d_v = on_gpu_at(v0, layout.offset);
          const at::Tensor d_grad = on_gpu_at(grad, layout.grad_offset);
          const at::Tensor d_half =
              with_half ? on_gpu_at(torch::zeros({n}, half_dtype), layout.offset) : at::Tensor();
          deepspeed::optim::device_adam_step(d_master, d_grad, d_m, d_v, h.p, d_half);
          expect_same_bits(d_grad, grad, what + ": the gradient (read only)");
          expect_same_bits(d_master, master, what + ": master");
          expect_same_bits(d_m, m, what + ": exp_avg");
          expect_same_bits(d_v, v, what + ": exp_avg_sq");
          if (with_half) expect_same_bits(d_half, half, what + ": 16-bit copy");
          if (HasFailure()) return;  // one failing combination says enough
        }
      }
    }
  }
}

// DS_DEVICE_ADAM=libtorch runs libtorch's fused kernel instead (fp32 gradients: the stages widen
// 16-bit ones first, as before the kernel): within float rounding of the CPU kernel, and a bf16
// gradient, which only the kernel reads, is refused naming the variable.
TEST(GpuAdamKernel, LibtorchsFusedKernelStaysAChoice) {
  SKIP_WITHOUT_KERNEL();
  const dstest::ScopedEnv libtorch(kAdamChoice, "libtorch");
  EXPECT_FALSE(deepspeed::optim::device_adam_reads_16bit_grads());
  torch::manual_seed(5);
  const int64_t n = 100003;
  at::Tensor master = torch::randn({n}), m = torch::randn({n}) * 1e-2, v = torch::rand({n}) * 1e-4;
  const at::Tensor grad = torch::randn({n}) * 1e-2;
  at::Tensor d_master = master.cuda(), d_m = m.cuda(), d_v = v.cuda();
  const AdamStepParams p = hypers()[0].p;
  try {
    deepspeed::optim::device_adam_step(d_master, grad.to(at::kBFloat16).cuda(), d_m, d_v, p,
                                       at::Tensor());
    ADD_FAILURE() << "a bf16 gradient reached libtorch's fused kernel";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("DS_DEVICE_ADAM"), std::string::npos) << e.what();
  }
  deepspeed::optim::device_adam_step(d_master, grad.cuda(), d_m, d_v, p, at::Tensor());
  deepspeed::optim::adam_step(master.data_ptr<float>(), grad.data_ptr<float>(),
                              m.data_ptr<float>(), v.data_ptr<float>(), n, p);
  // libtorch's fused kernel computes the moments and the decay in double and rounds once; the
  // CPU kernel rounds β1·m to float before adding (1 − β1)·g. Where those two nearly cancel the
  // new exp_avg is tiny and the relative difference large, so each tensor is checked against
  // rtol·|want| + atol, atol a few float ulps of the tensor's own scale (master ~1, exp_avg ~1e-2,
  // exp_avg_sq ~1e-4): the largest ratio must stay at most 1.
  auto worst = [](const at::Tensor& got, const at::Tensor& want, double atol) {
    return ((got.cpu() - want).abs() / (want.abs() * 1e-5 + atol)).max().item<double>();
  };
  EXPECT_LE(worst(d_master, master, 1e-6), 1.0);
  EXPECT_LE(worst(d_m, m, 1e-8), 1.0);
  EXPECT_LE(worst(d_v, v, 1e-11), 1.0);
}

// ZeRO-Offload's CPU Adam and the GPU kernel are one formula (optim/adam_math.h): ZeRO-2 in bf16
// at world size 1 trains bit for bit the same with the optimizer on the GPU and offloaded to the
// CPU, stepped after backward and during it (the gradients reach both as the same bf16 values;
// widening them is exact).
TEST(GpuAdamKernel, OffloadedAdamTrainsAsTheGpuAdamBitForBit) {
  SKIP_WITHOUT_KERNEL();
  const dstest::ScopedEnv kernel(kAdamChoice, nullptr);
  dstest::RunSpec spec;
  spec.backend = "nccl";
  spec.device = "cuda";
  spec.steps = 8;
  spec.config = dstest::base_config(4, 1, 2);
  spec.config["bf16"] = {{"enabled", true}};
  const dstest::Deterministic deterministic;
  const auto on_gpu = dstest::train_gpt(spec);
  for (bool overlap : {false, true}) {
    spec.config["zero_optimization"]["offload_optimizer"] = {
        {"device", "cpu"}, {"pin_memory", true}, {"overlap_step", overlap}};
    const auto offloaded = dstest::train_gpt(spec);
    EXPECT_EQ(offloaded.losses, on_gpu.losses) << "overlap_step " << overlap;
    ASSERT_EQ(offloaded.weights.size(), on_gpu.weights.size());
    for (size_t i = 0; i < on_gpu.weights.size(); ++i)
      EXPECT_TRUE(torch::equal(offloaded.weights[i], on_gpu.weights[i]))
          << "overlap_step " << overlap << " parameter " << i;
  }
}

// The bf16 step of ZeRO-1 and ZeRO-2 on the GPU allocates no fp32 copy of the gradient
// partition (4 bytes per parameter, what the step took before the kernel): from the second step
// (the first creates the moments) the step's peak above what was allocated before it stays under
// half of that.
TEST(GpuAdamKernel, MixedPrecisionStepWidensNoGradients) {
  SKIP_WITHOUT_KERNEL();
  const dstest::ScopedEnv kernel(kAdamChoice, nullptr);
  const c10::Device gpu(c10::kCUDA, 0);
  for (int stage : {1, 2}) {
    dstest::RunSpec spec;
    spec.backend = "nccl";
    spec.device = "cuda";
    spec.steps = 3;
    spec.model = gpt::GPTConfig{256, 64, 2, 4, 256};  // ~1.7M parameters: a 6.8 MB fp32 copy
    spec.config = dstest::base_config(4, 1, stage);
    spec.config["bf16"] = {{"enabled", true}};
    int64_t largest = 0;
    int steps = 0;
    spec.step = [&](deepspeed::Engine& engine) {
      deepspeed::synchronize_device(gpu);
      deepspeed::reset_device_memory_peaks(gpu);
      const int64_t before = deepspeed::device_memory(gpu).allocated;
      engine.step();
      deepspeed::synchronize_device(gpu);
      if (++steps >= 2) largest = std::max(largest, deepspeed::device_memory(gpu).allocated_peak - before);
    };
    dstest::train_gpt(spec);
    const int64_t widened = 4 * dstest::count_parameters(spec.model);
    EXPECT_LT(largest, widened / 2) << "stage " << stage << ": the step took " << largest
                                    << " bytes beyond what it held; a widened copy is " << widened;
  }
}

}  // namespace device_adam_gpu_test
