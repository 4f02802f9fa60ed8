// What a checkpoint's recomputation must see to match its first run, and the errors when it cannot:
// inputs changed in place after the checkpoint (an error at backward, as PyTorch's saved tensors
// give), a segment that changes its own inputs in place (an error at once: the recomputation would
// apply the change a second time), whatever the config; the autocast settings of the first run
// re-entered for the recomputation (gradients equal the uncheckpointed ones under CPU bf16 autocast).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "deepspeed/checkpointing.h"
#include "deepspeed/errors.h"
#include "util/torch_compat.h"

namespace activation_checkpoint_state_test {

namespace ckpt = deepspeed::checkpointing;
namespace compat = deepspeed::compat;

// The configs whose saved inputs differ in kind: the tensor itself, or a copy (cpu_checkpointing
// copies only GPU tensors, so on the CPU it is the first kind again; partition_activations is
// covered in tests/dist/partition_activations_test.cpp).
class CheckpointInputs : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    ckpt::Options o;
    o.cpu_checkpointing = GetParam();
    ckpt::configure(o);
    ckpt::reset_stats();
  }
  void TearDown() override { ckpt::configure(ckpt::Options{}); }
};

namespace {

// Runs `f` and returns the message of the deepspeed::Error it throws ("" when none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const deepspeed::Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

// h changed after the checkpoint: the recomputation would read h + 1 and give
// x.grad = 2 cos(2x + 1) instead of 2 cos(2x) without a word.
TEST_P(CheckpointInputs, InputChangedInPlaceAfterTheCheckpointIsAnErrorAtBackward) {
  auto x = torch::randn({5}, torch::requires_grad());
  auto h = x * 2;
  auto y = ckpt::checkpoint([](const torch::Tensor& t) { return t.sin(); }, h);
  h.add_(1);
  const std::string msg = error_of([&] { y.sum().backward(); });
  EXPECT_TRUE(contains(msg, "input 0")) << msg;
  EXPECT_TRUE(contains(msg, "modified by an inplace operation")) << msg;
  EXPECT_TRUE(contains(msg, "after the checkpoint")) << msg;
}

TEST_P(CheckpointInputs, AnInputThatIsNotChangedStillWorksAlongsideOneThatIs) {
  // Index named is the changed one (the second), and an unchanged run of the same passes.
  auto a = torch::randn({3}, torch::requires_grad());
  auto b = torch::randn({3});
  auto seg = [](const std::vector<torch::Tensor>& in) {
    return std::vector<torch::Tensor>{in[0] * in[1]};
  };
  auto y = ckpt::checkpoint(seg, {a, b});
  b.mul_(2);
  const std::string msg = error_of([&] { y[0].sum().backward(); });
  EXPECT_TRUE(contains(msg, "input 1")) << msg;

  auto c = torch::randn({3});
  a.mutable_grad().reset();
  ckpt::checkpoint(seg, {a, c})[0].sum().backward();
  EXPECT_TRUE(torch::equal(a.grad(), c));
}

// The segment multiplies its input (which needs no grad) by 3 in place: the first run sees 3t, the
// recomputation would see 9t and give w.grad = 9 t instead of 3 t. Refused when it happens.
TEST_P(CheckpointInputs, ASegmentThatChangesItsInputInPlaceIsAnErrorAtForward) {
  auto w = torch::ones({4}, torch::requires_grad());
  auto x = torch::ones({4});
  auto seg = [&w](const torch::Tensor& t) { return t.mul_(3) * w; };
  const std::string msg = error_of([&] { ckpt::checkpoint(seg, x); });
  EXPECT_TRUE(contains(msg, "input 0")) << msg;
  EXPECT_TRUE(contains(msg, "must not modify its inputs in place")) << msg;
  EXPECT_EQ(ckpt::stats().saved_bytes, 0);  // what it had kept is released
}

INSTANTIATE_TEST_SUITE_P(SavedAsTensorOrCopy, CheckpointInputs, ::testing::Bool(),
                         [](const auto& info) {
                           return std::string(info.param ? "CpuCheckpointing" : "Plain");
                         });

namespace {

// CPU bf16 autocast for a scope (torch.autocast("cpu", dtype=torch.bfloat16)).
class CpuBf16Autocast {
 public:
  CpuBf16Autocast()
      : enabled_(compat::autocast_enabled(c10::kCPU)), dtype_(compat::autocast_dtype(c10::kCPU)) {
    compat::set_autocast_enabled(c10::kCPU, true);
    compat::set_autocast_dtype(c10::kCPU, at::kBFloat16);
  }
  ~CpuBf16Autocast() {
    compat::set_autocast_enabled(c10::kCPU, enabled_);
    compat::set_autocast_dtype(c10::kCPU, dtype_);
    at::autocast::clear_cache();
  }

 private:
  bool enabled_;
  at::ScalarType dtype_;
};

struct Grads {
  torch::Tensor x, weight, bias;
};

// Forward under CPU bf16 autocast, backward after it ends (the usual AMP loop).
Grads autocast_step(bool checkpointing) {
  torch::manual_seed(0);
  torch::nn::Linear lin(16, 16);
  auto x = torch::randn({8, 16}, torch::requires_grad());
  auto block = [lin](const torch::Tensor& t) mutable { return torch::gelu(lin->forward(t)); };
  torch::Tensor loss;
  {
    CpuBf16Autocast amp;
    auto y = checkpointing ? ckpt::checkpoint(block, x) : block(x);
    EXPECT_EQ(y.scalar_type(), at::kBFloat16);
    loss = y.to(at::kFloat).pow(2).sum();
  }
  EXPECT_FALSE(compat::autocast_enabled(c10::kCPU));
  loss.backward();
  EXPECT_FALSE(compat::autocast_enabled(c10::kCPU)) << "the recomputation leaked autocast";
  return {x.grad(), lin->weight.grad(), lin->bias.grad()};
}

}  // namespace

TEST(CheckpointAutocast, RecomputationRunsUnderTheFirstRunsCpuAutocast) {
  ckpt::configure(ckpt::Options{});
  const Grads plain = autocast_step(false);
  const Grads checkpointed = autocast_step(true);
  EXPECT_TRUE(torch::equal(plain.x, checkpointed.x));
  EXPECT_TRUE(torch::equal(plain.weight, checkpointed.weight))
      << (plain.weight - checkpointed.weight).abs().max().item<double>();
  EXPECT_TRUE(torch::equal(plain.bias, checkpointed.bias));
}

// And the other way: forward without autocast, backward inside an autocast region: the
// recomputation is fp32 like the first run.
TEST(CheckpointAutocast, RecomputationOfAnFp32ForwardIgnoresAnAutocastAroundBackward) {
  ckpt::configure(ckpt::Options{});
  auto run = [](bool checkpointing) {
    torch::manual_seed(0);
    torch::nn::Linear lin(16, 16);
    auto x = torch::randn({8, 16}, torch::requires_grad());
    auto block = [lin](const torch::Tensor& t) mutable { return torch::gelu(lin->forward(t)); };
    auto loss = (checkpointing ? ckpt::checkpoint(block, x) : block(x)).pow(2).sum();
    CpuBf16Autocast amp;
    loss.backward();
    return lin->weight.grad();
  };
  EXPECT_TRUE(torch::equal(run(false), run(true)));
}

}  // namespace activation_checkpoint_state_test
