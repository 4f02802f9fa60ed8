// The vectorised Adam kernel against libtorch's own optimizers, across ISA paths, thread
// counts, tails and the fused 16-bit copy.
#include "optim/cpu_adam.h"
#include "optim/cpu_adam_kernels.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

namespace deepspeed::optim {
namespace cpu_adam_test {

// Relative error of a against the reference b: max|a-b| / max(max|b|, 1e-8). The kernel uses
// libtorch's op order, so the two differ only where libtorch's own scalar tail contracts a
// multiply-add differently (an ulp or two); 1e-6 is ~8 ulps of the largest element.
constexpr double kRelTol = 1e-6;

// Computed by libtorch, as randn below is drawn by it: the test files are compiled at -O0
// (tests/CMakeLists.txt), where element loops over a million floats cost seconds.
double rel_err(const float* a, const torch::Tensor& b_in) {
  const torch::Tensor b = b_in.reshape({-1}).to(torch::kFloat64);
  if (b.numel() == 0) return 0.0;
  const torch::Tensor got =
      torch::from_blob(const_cast<float*>(a), {b.numel()}, torch::kFloat32).to(torch::kFloat64);
  const double diff = (got - b).abs().max().item<double>();
  return diff / std::max(b.abs().max().item<double>(), 1e-8);
}

std::vector<float> randn(int64_t n, uint32_t seed, float scale = 1.0f) {
  const torch::Tensor t = torch::randn({n}, at::detail::createCPUGenerator(seed)).mul_(scale);
  std::vector<float> out(n);
  if (n > 0) std::memcpy(out.data(), t.data_ptr<float>(), size_t(n) * sizeof(float));
  return out;
}

torch::Tensor as_tensor(std::vector<float>& v) {
  return torch::from_blob(v.data(), {int64_t(v.size())}, torch::kFloat32);
}

// Our state for one flat buffer; step() runs the kernel exactly as ZeRO will.
struct Flat {
  std::vector<float> param, m, v;
  explicit Flat(std::vector<float> p) : param(std::move(p)), m(param.size()), v(param.size()) {}
  void step(const float* grad, const AdamStepParams& p, uint16_t* p16 = nullptr,
            Half16Kind kind = Half16Kind::BF16) {
    adam_step(param.data(), grad, m.data(), v.data(), int64_t(param.size()), p, p16, kind);
  }
};

AdamStepParams hyper(bool adamw, float wd, float grad_scale) {
  AdamStepParams p;
  p.lr = 1e-3f;
  p.beta1 = 0.9f;
  p.beta2 = 0.999f;
  p.eps = 1e-8f;
  p.weight_decay = wd;
  p.adamw_mode = adamw;
  p.grad_scale = grad_scale;
  p.num_threads = 1;
  return p;
}

std::unique_ptr<torch::optim::Optimizer> torch_optimizer(torch::Tensor param,
                                                         const AdamStepParams& p) {
  if (p.adamw_mode) {
    auto o = torch::optim::AdamWOptions(p.lr).betas({p.beta1, p.beta2}).eps(p.eps).weight_decay(
        p.weight_decay);
    return std::make_unique<torch::optim::AdamW>(std::vector<torch::Tensor>{param}, o);
  }
  auto o = torch::optim::AdamOptions(p.lr).betas({p.beta1, p.beta2}).eps(p.eps).weight_decay(
      p.weight_decay);
  return std::make_unique<torch::optim::Adam>(std::vector<torch::Tensor>{param}, o);
}

// exp_avg / exp_avg_sq of the optimizer's only parameter (the state map's key type differs
// between libtorch 1.13 and 2.x, so it is not looked up by key).
std::pair<torch::Tensor, torch::Tensor> torch_moments(torch::optim::Optimizer& opt, bool adamw) {
  auto& state = *opt.state().begin()->second;
  if (adamw) {
    auto& s = static_cast<torch::optim::AdamWParamState&>(state);
    return {s.exp_avg(), s.exp_avg_sq()};
  }
  auto& s = static_cast<torch::optim::AdamParamState&>(state);
  return {s.exp_avg(), s.exp_avg_sq()};
}

// ---- against libtorch -------------------------------------------------------------------

using TorchCase = std::tuple<int64_t /*n*/, bool /*adamw*/, float /*wd*/, float /*grad_scale*/>;

class CpuAdamVsTorch : public ::testing::TestWithParam<TorchCase> {};

TEST_P(CpuAdamVsTorch, TenStepsMatchWithinTolerance) {
  const auto [n, adamw, wd, grad_scale] = GetParam();
  const AdamStepParams hp = hyper(adamw, wd, grad_scale);
  Flat ours(randn(n, 1));
  torch::Tensor ref = as_tensor(ours.param).clone().requires_grad_(true);
  auto opt = torch_optimizer(ref, hp);
  for (int64_t step = 1; step <= 10; ++step) {
    std::vector<float> grad = randn(n, 100 + uint32_t(step), 0.1f);
    AdamStepParams p = hp;
    p.step = step;
    ours.step(grad.data(), p);
    // libtorch sees the already-scaled gradient, as it would after unscale_ / clipping.
    ref.mutable_grad() = as_tensor(grad).clone().mul_(grad_scale);
    opt->step();
    if (n == 0) continue;
    torch::NoGradGuard no_grad;
    auto [m_ref, v_ref] = torch_moments(*opt, adamw);
    ASSERT_LE(rel_err(ours.param.data(), ref), kRelTol) << "param, step " << step;
    ASSERT_LE(rel_err(ours.m.data(), m_ref), kRelTol) << "exp_avg, step " << step;
    ASSERT_LE(rel_err(ours.v.data(), v_ref), kRelTol) << "exp_avg_sq, step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, CpuAdamVsTorch,
    ::testing::Combine(::testing::Values<int64_t>(0, 1, 15, 17, 1000003), ::testing::Bool(),
                       ::testing::Values(0.0f, 0.01f), ::testing::Values(1.0f, 0.125f)));

// ---- formula details torch cannot check --------------------------------------------------

TEST(CpuAdam, NoBiasCorrectionUsesRawMoments) {
  std::vector<float> g = randn(17, 7, 0.1f);
  Flat ours(randn(17, 8));
  const std::vector<float> p0 = ours.param;
  AdamStepParams p = hyper(true, 0.0f, 1.0f);
  p.bias_correction = false;
  p.step = 3;  // would matter if bias correction were applied
  ours.step(g.data(), p);
  for (size_t i = 0; i < g.size(); ++i) {
    const double m = 0.1 * g[i], v = 0.001 * double(g[i]) * g[i];
    const double want = p0[i] - 1e-3 * m / (std::sqrt(v) + 1e-8);
    EXPECT_NEAR(ours.param[i], want, 1e-6 * std::abs(want) + 1e-9) << i;
  }
}

TEST(CpuAdam, RejectsStepZeroWithBiasCorrection) {
  Flat ours(randn(4, 1));
  std::vector<float> g(4, 1.0f);
  AdamStepParams p = hyper(true, 0.0f, 1.0f);
  p.step = 0;
  EXPECT_THROW(ours.step(g.data(), p), std::invalid_argument);
}

// ---- ISA paths and threads are bit-identical to the scalar kernel -------------------------

std::vector<AdamIsa> supported_isas() {
  std::vector<AdamIsa> out;
  for (AdamIsa isa : {AdamIsa::Scalar, AdamIsa::Avx2, AdamIsa::Avx512}) {
    if (adam_isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

struct IsaGuard {
  ~IsaGuard() { reset_adam_isa(); }
};

// Three steps of one configuration under the given ISA and thread count.
struct RunResult {
  Flat flat;
  std::vector<uint16_t> p16;
};

RunResult run_steps(AdamIsa isa, int threads, int64_t n, const AdamStepParams& hp, Half16Kind kind) {
  IsaGuard guard;
  set_adam_isa(isa);
  RunResult r{Flat(randn(n, 3)), std::vector<uint16_t>(n)};
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<float> grad = randn(n, 40 + uint32_t(step), 0.1f);
    AdamStepParams p = hp;
    p.step = step;
    p.num_threads = threads;
    r.flat.step(grad.data(), p, r.p16.data(), kind);
  }
  return r;
}

void expect_same_bits(const RunResult& a, const RunResult& b, const std::string& what) {
  const size_t bytes = a.flat.param.size() * sizeof(float);
  EXPECT_EQ(0, std::memcmp(a.flat.param.data(), b.flat.param.data(), bytes)) << what << " param";
  EXPECT_EQ(0, std::memcmp(a.flat.m.data(), b.flat.m.data(), bytes)) << what << " exp_avg";
  EXPECT_EQ(0, std::memcmp(a.flat.v.data(), b.flat.v.data(), bytes)) << what << " exp_avg_sq";
  EXPECT_EQ(a.p16, b.p16) << what << " param16";
}

TEST(CpuAdam, EveryIsaAndThreadCountMatchesScalarBitForBit) {
  for (int64_t n : {1, 7, 15, 17, 33, 1000003}) {
    for (bool adamw : {true, false}) {
      for (Half16Kind kind : {Half16Kind::BF16, Half16Kind::FP16}) {
        const AdamStepParams hp = hyper(adamw, 0.01f, 0.5f);
        const RunResult want = run_steps(AdamIsa::Scalar, 1, n, hp, kind);
        for (AdamIsa isa : supported_isas()) {
          for (int threads : {1, 2, 3}) {
            const RunResult got = run_steps(isa, threads, n, hp, kind);
            expect_same_bits(got, want, "n=" + std::to_string(n) + " isa=" +
                                            std::to_string(int(isa)) +
                                            " threads=" + std::to_string(threads));
          }
        }
      }
    }
  }
}

// The AVX-512 kernel writes the 16-bit copy in whole 64-byte lines with streaming stores after
// a scalar head up to the first aligned line: every start of the copy within a line, and lengths
// around the 32-element blocks, give the scalar kernel's bits (params and copy). Other bytes of
// the buffer stay untouched.
TEST(CpuAdam, SixteenBitCopyAtEveryAlignmentMatchesScalar) {
  constexpr uint16_t kUntouched = 0xABCD;
  for (AdamIsa isa : supported_isas()) {
    for (Half16Kind kind : {Half16Kind::BF16, Half16Kind::FP16}) {
      for (int64_t n : {1, 31, 32, 33, 63, 64, 71, 1000}) {
        for (int64_t offset = 0; offset < 34; ++offset) {
          const AdamStepParams hp = hyper(true, 0.01f, 1.0f);
          std::vector<float> grad = randn(n, 77, 0.1f);
          auto run = [&](AdamIsa which) {
            IsaGuard guard;
            set_adam_isa(which);
            Flat flat(randn(n, 78));
            // 64-byte aligned storage, the copy starting `offset` elements into it.
            std::vector<uint16_t> storage(n + 64 + 32, kUntouched);
            const auto base = reinterpret_cast<uintptr_t>(storage.data());
            const int64_t lead = static_cast<int64_t>((64 - base % 64) % 64 / 2) + offset;
            flat.step(grad.data(), hp, storage.data() + lead, kind);
            return std::make_tuple(flat.param, storage, lead);
          };
          const auto [want_param, want_storage, want_lead] = run(AdamIsa::Scalar);
          const auto [got_param, got_storage, got_lead] = run(isa);
          const std::string what = "isa " + std::to_string(int(isa)) + " n " + std::to_string(n) +
                                   " offset " + std::to_string(offset);
          EXPECT_EQ(got_param, want_param) << what;
          const std::vector<uint16_t> want(want_storage.begin() + want_lead,
                                           want_storage.begin() + want_lead + n);
          const std::vector<uint16_t> got(got_storage.begin() + got_lead,
                                          got_storage.begin() + got_lead + n);
          EXPECT_EQ(got, want) << what;
          for (int64_t k = 0; k < static_cast<int64_t>(got_storage.size()); ++k) {
            if (k < got_lead || k >= got_lead + n) {
              ASSERT_EQ(got_storage[k], kUntouched) << what << " wrote element " << k;
            }
          }
        }
      }
    }
  }
}

// bf16 gradients (bits) widened in cache by each thread: adam_step's result on the widened
// gradients, bit for bit, for every ISA, thread count and length (one chunk, several, a tail).
TEST(CpuAdam, Bf16GradientsGiveTheWidenedGradientsStep) {
  for (int64_t n : {1, 17, 40000, 100003}) {
    std::vector<float> grad = randn(n, 91, 0.1f);
    std::vector<uint16_t> grad16(n);
    for (int64_t i = 0; i < n; ++i) grad16[i] = detail::float_to_bf16_bits(grad[i]);
    std::vector<float> widened(n);
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t u = static_cast<uint32_t>(grad16[i]) << 16;
      std::memcpy(&widened[i], &u, 4);
    }
    for (AdamIsa isa : supported_isas()) {
      for (int threads : {1, 2, 3}) {
        IsaGuard guard;
        set_adam_isa(isa);
        AdamStepParams hp = hyper(true, 0.01f, 0.5f);
        hp.num_threads = threads;
        Flat want(randn(n, 92)), got = want;
        std::vector<uint16_t> want16(n), got16(n);
        for (int64_t step = 1; step <= 2; ++step) {
          hp.step = step;
          adam_step(want.param.data(), widened.data(), want.m.data(), want.v.data(), n, hp,
                    want16.data(), Half16Kind::BF16);
          adam_step_bf16_grad(got.param.data(), grad16.data(), got.m.data(), got.v.data(), n, hp,
                              got16.data(), Half16Kind::BF16);
        }
        const std::string what = "n " + std::to_string(n) + " isa " + std::to_string(int(isa)) +
                                 " threads " + std::to_string(threads);
        EXPECT_EQ(got.param, want.param) << what;
        EXPECT_EQ(got.m, want.m) << what;
        EXPECT_EQ(got.v, want.v) << what;
        EXPECT_EQ(got16, want16) << what;
      }
    }
  }
}

TEST(CpuAdam, ReportsTheIsaInUse) {
  IsaGuard guard;
  for (AdamIsa isa : supported_isas()) {
    set_adam_isa(isa);
    const std::string name = adam_kernel_isa();
    EXPECT_EQ(name, isa == AdamIsa::Scalar ? "scalar" : isa == AdamIsa::Avx2 ? "avx2" : "avx512");
  }
}

// ---- the fused 16-bit copy equals libtorch's conversion of the fp32 result ----------------

// Values that exercise rounding: ties to even both ways, denormals, overflow to inf, -0, inf.
std::vector<float> tricky_values() {
  auto bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  std::vector<float> v = {
      bits(0x3F808000),  // bf16 tie, even below
      bits(0x3F818000),  // bf16 tie, odd below -> rounds up
      bits(0x3F808001), bits(0x3F807FFF), bits(0x00000001), bits(0x807FFFFF), bits(0x00400000),
      bits(0x7F7FFFFF),  // max float -> bf16 inf
      -0.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
      65504.0f, 65519.0f, 65520.0f, -70000.0f,  // fp16 max / rounds to max / to inf
      5.9604645e-08f, 2.9802322e-08f, 8.940697e-08f, 1e-10f,  // fp16 denormal ties, underflow
      1.0009765625f + 0.00048828125f,  // fp16 tie
      3.14159265f, -2.71828f, 1e-3f, 123456.789f};
  return v;
}

void check_half_copy(Half16Kind kind, c10::ScalarType dtype) {
  // lr = 0 and zero grads leave param unchanged, so the 16-bit copy sees exactly these values.
  std::vector<float> base = tricky_values();
  std::vector<float> vals;
  while (vals.size() < 2 * 16 + 13) vals.insert(vals.end(), base.begin(), base.end());
  std::vector<float> rnd = randn(1000, 9, 10.0f);
  vals.insert(vals.end(), rnd.begin(), rnd.end());
  const int64_t n = int64_t(vals.size());
  std::vector<float> zeros(n, 0.0f);
  for (AdamIsa isa : supported_isas()) {
    IsaGuard guard;
    set_adam_isa(isa);
    Flat ours(vals);
    std::vector<uint16_t> p16(n);
    AdamStepParams p = hyper(true, 0.0f, 1.0f);
    p.lr = 0.0f;
    ours.step(zeros.data(), p, p16.data(), kind);
    const torch::Tensor want = as_tensor(ours.param).to(dtype).contiguous();
    const auto* wp = static_cast<const uint16_t*>(want.data_ptr());
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(p16[i], wp[i]) << "isa " << int(isa) << " value " << ours.param[i];
    }
  }
}

TEST(CpuAdam, Bf16CopyEqualsTorchConversion) { check_half_copy(Half16Kind::BF16, torch::kBFloat16); }

TEST(CpuAdam, Fp16CopyEqualsTorchConversion) { check_half_copy(Half16Kind::FP16, torch::kHalf); }

TEST(CpuAdam, Bf16CopyOfUpdatedParamsEqualsTorchConversion) {
  const int64_t n = 100003;
  for (AdamIsa isa : supported_isas()) {
    IsaGuard guard;
    set_adam_isa(isa);
    Flat ours(randn(n, 5));
    std::vector<float> grad = randn(n, 6, 0.1f);
    std::vector<uint16_t> b16(n), h16(n);
    Flat twin = ours;
    ours.step(grad.data(), hyper(true, 0.01f, 1.0f), b16.data(), Half16Kind::BF16);
    twin.step(grad.data(), hyper(true, 0.01f, 1.0f), h16.data(), Half16Kind::FP16);
    const torch::Tensor b = as_tensor(ours.param).to(torch::kBFloat16).contiguous();
    const torch::Tensor h = as_tensor(twin.param).to(torch::kHalf).contiguous();
    EXPECT_EQ(0, std::memcmp(b16.data(), b.data_ptr(), n * 2)) << "bf16, isa " << int(isa);
    EXPECT_EQ(0, std::memcmp(h16.data(), h.data_ptr(), n * 2)) << "fp16, isa " << int(isa);
  }
}

TEST(CpuAdam, NanParamGivesCanonicalBf16Nan) {
  for (AdamIsa isa : supported_isas()) {
    IsaGuard guard;
    set_adam_isa(isa);
    Flat ours(std::vector<float>(19, std::numeric_limits<float>::quiet_NaN()));
    std::vector<float> grad(19, 0.0f);
    std::vector<uint16_t> b16(19);
    ours.step(grad.data(), hyper(true, 0.0f, 1.0f), b16.data(), Half16Kind::BF16);
    for (uint16_t b : b16) EXPECT_EQ(b, 0x7FC0) << "isa " << int(isa);
  }
}

}  // namespace cpu_adam_test
}  // namespace deepspeed::optim
