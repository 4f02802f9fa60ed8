// adam_step_buffers (cpu_adam.h): masters in bf16 or fp16, moments in fp32 or bf16, gradients
// in fp32, bf16 or fp16. Each must equal adam_step on the widened values with the results rounded
// back, bit for bit, on every ISA path and thread count; and FusedAdam must step a 16-bit master
// that way, whole or in ranges.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "optim/cpu_adam.h"
#include "optim/cpu_adam_kernels.h"
#include "optim/fused_adam.h"
#include "util/torch_compat.h"
#include "support/adam_hyper.h"

namespace deepspeed::optim {
namespace low_precision_adam_test {
namespace {

at::ScalarType dtype_of(AdamElem e) {
  return e == AdamElem::F32 ? at::kFloat : e == AdamElem::BF16 ? at::kBFloat16 : at::kHalf;
}

std::string name_of(AdamElem e) {
  return e == AdamElem::F32 ? "fp32" : e == AdamElem::BF16 ? "bf16" : "fp16";
}

AdamStepParams hyper(int64_t step) {
  AdamStepParams p;
  p.lr = 1e-2f;
  p.weight_decay = 0.1f;
  p.step = step;
  p.grad_scale = 0.5f;  // a loss scale's inverse, applied in fp32 inside the kernel
  return p;
}

// The reference: the fp32 kernel on fp32 copies of everything, then rounded into each format.
struct Reference {
  at::Tensor param, m, v;  // fp32
  void step(const at::Tensor& grad, const AdamStepParams& p) {
    at::Tensor g = grad.to(at::kFloat).contiguous();
    adam_step(param.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(),
              v.data_ptr<float>(), param.numel(), p);
  }
  // What the low-precision buffers must hold after each step: the fp32 results rounded.
  void round_into(AdamElem param_format, AdamElem moment_format) {
    param = param.to(dtype_of(param_format)).to(at::kFloat);
    m = m.to(dtype_of(moment_format)).to(at::kFloat);
    v = v.to(dtype_of(moment_format)).to(at::kFloat);
  }
};

using Formats = std::tuple<AdamElem, AdamElem, AdamElem>;  // param, moments, gradients

class AdamBuffersFormats : public ::testing::TestWithParam<Formats> {};

TEST_P(AdamBuffersFormats, EqualTheFp32StepOnWidenedValuesRounded) {
  const auto [pf, mf, gf] = GetParam();
  // Odd sizes for the tails; one above the OpenMP threshold for the threaded split.
  for (int64_t n : {int64_t{1}, int64_t{37}, int64_t{2048 + 13}, detail::kAdamParallelMin + 5}) {
    for (int threads : {1, 2}) {
      torch::manual_seed(n + threads);
      at::Tensor param = (torch::randn({n}) * 0.1).to(dtype_of(pf));
      at::Tensor m = torch::zeros({n}, dtype_of(mf)), v = torch::zeros({n}, dtype_of(mf));
      // Copies (to(kFloat) of an fp32 tensor would be the tensor itself).
      Reference ref{param.to(at::kFloat).clone(), m.to(at::kFloat).clone(),
                    v.to(at::kFloat).clone()};
      at::Tensor copy = torch::empty({n}, dtype_of(pf == AdamElem::F32 ? AdamElem::BF16 : pf));
      for (int64_t step = 1; step <= 3; ++step) {
        at::Tensor grad = torch::randn({n}).to(dtype_of(gf));
        AdamBuffers b;
        b.param = param.data_ptr();
        b.param_format = pf;
        b.exp_avg = m.data_ptr();
        b.exp_avg_sq = v.data_ptr();
        b.moment_format = mf;
        AdamStepParams p = hyper(step);
        p.num_threads = threads;
        const Half16Kind copy_kind =
            copy.scalar_type() == at::kHalf ? Half16Kind::FP16 : Half16Kind::BF16;
        adam_step_buffers(b, grad.data_ptr(), gf, n, p, static_cast<uint16_t*>(copy.data_ptr()),
                          copy_kind);
        ref.step(grad, p);
        // The copy is the fp32 update rounded, taken before the master is (it equals the master
        // where the formats agree).
        const at::Tensor want_copy = ref.param.to(copy.scalar_type());
        ref.round_into(pf, mf);
        const std::string where = "n " + std::to_string(n) + ", " + std::to_string(threads) +
                                  " threads, step " + std::to_string(step);
        ASSERT_TRUE(torch::equal(param.to(at::kFloat), ref.param)) << where;
        ASSERT_TRUE(torch::equal(m.to(at::kFloat), ref.m)) << where;
        ASSERT_TRUE(torch::equal(v.to(at::kFloat), ref.v)) << where;
        ASSERT_TRUE(torch::equal(copy, want_copy)) << where;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllFormats, AdamBuffersFormats,
    ::testing::Combine(::testing::Values(AdamElem::F32, AdamElem::BF16, AdamElem::FP16),
                       ::testing::Values(AdamElem::F32, AdamElem::BF16),
                       ::testing::Values(AdamElem::F32, AdamElem::BF16, AdamElem::FP16)),
    [](const auto& info) {
      return "param_" + name_of(std::get<0>(info.param)) + "_moments_" +
             name_of(std::get<1>(info.param)) + "_grads_" + name_of(std::get<2>(info.param));
    });

// Every instruction-set path the CPU has gives the same bits (the update is the ISA's kernel,
// which equals the scalar one; the widening and rounding are 8 at a time beside AVX2, scalar with
// the scalar kernel), for each 16-bit master format and moment format.
TEST(AdamBuffersIsa, EveryPathGivesTheSameBits) {
  const int64_t n = 4099;
  for (AdamElem master : {AdamElem::BF16, AdamElem::FP16}) {
    for (AdamElem moments : {AdamElem::F32, AdamElem::BF16}) {
      torch::manual_seed(5);
      const at::Tensor start = (torch::randn({n}) * 0.1).to(dtype_of(master));
      const at::Tensor grad = torch::randn({n}).to(dtype_of(master));
      std::vector<at::Tensor> results;
      for (AdamIsa isa : {AdamIsa::Scalar, AdamIsa::Avx2, AdamIsa::Avx512}) {
        if (!adam_isa_supported(isa)) continue;
        set_adam_isa(isa);
        at::Tensor param = start.clone(), m = torch::zeros({n}, dtype_of(moments)), v = m.clone();
        AdamBuffers b{param.data_ptr(), master, m.data_ptr(), v.data_ptr(), moments};
        for (int64_t step = 1; step <= 2; ++step)
          adam_step_buffers(b, grad.data_ptr(), master, n, hyper(step));
        results.push_back(torch::cat({param.to(at::kFloat), m.to(at::kFloat), v.to(at::kFloat)}));
      }
      reset_adam_isa();
      for (size_t k = 1; k < results.size(); ++k)
        EXPECT_TRUE(torch::equal(results[k], results[0]))
            << name_of(master) << " masters, " << name_of(moments) << " moments, path " << k;
    }
  }
}

TEST(AdamBuffersErrors, Fp16MomentsAreRefused) {
  float p = 0, g = 0;
  uint16_t m = 0, v = 0;
  AdamBuffers b{&p, AdamElem::F32, &m, &v, AdamElem::FP16};
  EXPECT_THROW(adam_step_buffers(b, &g, AdamElem::F32, 1, hyper(1)), std::invalid_argument);
}

torch::optim::AdamWParamState& state_of(FusedAdam& adam, const at::Tensor& p) {
  return static_cast<torch::optim::AdamWParamState&>(
      *adam.state().at(compat::optimizer_state_key(p)));
}

// FusedAdam over a 16-bit master: moments made in the dtype keep_moments_in names; step() and
// ranges taken out of order give the same bits as adam_step_buffers over the whole buffer.
TEST(FusedAdamLowPrecision, StepsA16BitMasterWholeOrInRanges) {
  for (at::ScalarType moments : {at::kFloat, at::kBFloat16}) {
    const int64_t n = 1037;
    torch::manual_seed(9);
    const at::Tensor start = (torch::randn({n}) * 0.1).to(at::kBFloat16);
    at::Tensor whole = start.clone(), ranged = start.clone();
    FusedAdam a({whole}, dstest::decaying_adam_hyper()), b({ranged}, dstest::decaying_adam_hyper());
    a.keep_moments_in(moments);
    b.keep_moments_in(moments);
    at::Tensor ref = start.clone(), ref_m = torch::zeros({n}, moments), ref_v = ref_m.clone();
    for (int64_t step = 1; step <= 3; ++step) {
      at::Tensor grad = torch::randn({n}).to(at::kBFloat16);
      whole.mutable_grad() = grad;
      a.step();
      auto r = b.prepare_step(ranged);
      for (auto [begin, len] : {std::pair<int64_t, int64_t>{500, 537}, {0, 17}, {17, 483}})
        r.run_grads(static_cast<const uint16_t*>(grad.data_ptr()) + begin, AdamElem::BF16, begin,
                    len);
      AdamStepParams p;
      p.lr = 1e-2f;
      p.weight_decay = 0.1f;
      p.step = step;
      const AdamElem mf = moments == at::kFloat ? AdamElem::F32 : AdamElem::BF16;
      AdamBuffers buffers{ref.data_ptr(), AdamElem::BF16, ref_m.data_ptr(), ref_v.data_ptr(), mf};
      adam_step_buffers(buffers, grad.data_ptr(), AdamElem::BF16, n, p);
    }
    EXPECT_EQ(state_of(a, whole).exp_avg().scalar_type(), moments);
    EXPECT_TRUE(torch::equal(whole, ref));
    EXPECT_TRUE(torch::equal(ranged, ref));
    EXPECT_TRUE(torch::equal(state_of(a, whole).exp_avg_sq(), ref_v));
    EXPECT_TRUE(torch::equal(state_of(b, ranged).exp_avg(), ref_m));
  }
}

}  // namespace
}  // namespace low_precision_adam_test
}  // namespace deepspeed::optim
