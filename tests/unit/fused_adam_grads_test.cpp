// FusedAdam on the CPU reads bf16 and fp16 gradients as they are (FusedAdam::reads_grads_of):
// the ZeRO stages' mixed-precision step hands it the 16-bit gradient partition instead of a
// widened fp32 copy of it (4Ψ/N bytes less at the step, a pass less over memory). Widening is
// exact, so the step must equal the step on the widened gradients bit for bit, with one group or
// several groups over one flat master (set_flat), with a grad scale; gradients of another dtype
// are refused naming it.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>

#include "deepspeed/errors.h"
#include "deepspeed/optimizer.h"
#include "optim/fused_adam.h"
#include "util/allocation_meter.h"

namespace fused_adam_grads_test {

using deepspeed::optim::FusedAdam;

namespace {

deepspeed::AdamHyper hyper() {
  return deepspeed::parse_adam_params({"AdamW", {{"lr", 0.01}, {"weight_decay", 0.1}}});
}

// A master of n elements and its optimizer; with `flat`, elements [0, n/3) in group 0 (lr 0.01)
// and the rest in group 1 (lr 0.003, no decay), as a ZeRO partition over two groups.
struct Master {
  at::Tensor param;
  std::unique_ptr<FusedAdam> opt;
  Master(int64_t n, bool flat) {
    torch::manual_seed(3);
    param = torch::randn({n});
    opt = std::make_unique<FusedAdam>(std::vector<at::Tensor>{param}, hyper());
    if (!flat) return;
    auto options = std::make_unique<torch::optim::AdamWOptions>(0.003);
    options->weight_decay(0.0);
    opt->add_param_group(torch::optim::OptimizerParamGroup({torch::zeros({1})}, std::move(options)));
    opt->set_flat(param, {{0, n / 3, 0}, {n / 3, n - n / 3, 1}});
  }
  // Three steps on `grads` (bf16 values), given as they are or widened to fp32 first.
  void train(const std::vector<at::Tensor>& grads, bool widen) {
    for (const auto& g : grads) {
      param.mutable_grad() = widen ? g.to(torch::kFloat) : g;
      opt->set_grad_scale(0.5f);
      opt->step();
    }
  }
};

std::vector<at::Tensor> half_grads(int64_t n, at::ScalarType dtype = torch::kBFloat16) {
  torch::manual_seed(4);
  std::vector<at::Tensor> grads;
  for (int i = 0; i < 3; ++i) grads.push_back(torch::randn({n}).to(dtype));
  return grads;
}

}  // namespace

TEST(FusedAdamGrads, HalfGradientsStepAsTheirWidenedCopyBitForBit) {
  const int64_t n = 100003;  // odd: the kernels' vector tails
  for (auto [flat, dtype] : {std::pair{false, torch::kBFloat16}, {true, torch::kBFloat16},
                             {false, torch::kHalf}, {true, torch::kHalf}}) {
    SCOPED_TRACE(std::string(flat ? "two groups over a flat master" : "one parameter") + ", " +
                 c10::toString(dtype));
    const auto grads = half_grads(n, dtype);
    Master as_they_are(n, flat), widened(n, flat);
    as_they_are.train(grads, /*widen=*/false);
    widened.train(grads, /*widen=*/true);
    EXPECT_TRUE(torch::equal(as_they_are.param, widened.param));
    EXPECT_FALSE(torch::equal(as_they_are.param, Master(n, flat).param)) << "nothing was stepped";
  }
}

// Reading them as they are allocates no fp32 copy of the gradients (4n bytes).
TEST(FusedAdamGrads, HalfGradientsNeedNoWidenedCopy) {
  const int64_t n = 1 << 20;
  for (auto dtype : {torch::kBFloat16, torch::kHalf}) {
    Master m(n, /*flat=*/true);
    m.train(half_grads(n, dtype), false);  // the moments exist now
    m.param.mutable_grad() = torch::randn({n}).to(dtype);
    deepspeed::util::AllocationMeter meter;
    m.opt->step();
    EXPECT_LT(meter.peak_bytes(), 4 * n / 16) << dtype;
  }
}

TEST(FusedAdamGrads, WhichGradientsItReads) {
  const auto cpu = torch::zeros({2});
  EXPECT_TRUE(FusedAdam::reads_grads_of(cpu, torch::kFloat));
  EXPECT_TRUE(FusedAdam::reads_grads_of(cpu, torch::kBFloat16));
  EXPECT_TRUE(FusedAdam::reads_grads_of(cpu, torch::kHalf));
  EXPECT_FALSE(FusedAdam::reads_grads_of(cpu, torch::kDouble));
}

TEST(FusedAdamGrads, Fp64GradientsAreRefusedNamingTheirDtype) {
  Master m(64, false);
  m.param.mutable_grad() = torch::ones({64}).to(torch::kDouble);
  try {
    m.opt->step();
    FAIL() << "fp64 gradients were stepped";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("gradients of Double"), std::string::npos) << e.what();
  }
}

}  // namespace fused_adam_grads_test
