// Activation checkpointing on the GPU (label gpu): a segment that moves CPU inputs to the GPU and
// applies dropout there recomputes the same masks (the current CUDA device's generator is saved,
// not only those of the inputs' devices); CUDA autocast is re-entered for the recomputation; with
// cpu_checkpointing (inputs saved as host copies) in-place changes of an input are refused as they
// are without it. Every test skips, saying why, without a GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include <torch/torch.h>

#include "deepspeed/checkpointing.h"
#include "deepspeed/device.h"
#include "deepspeed/errors.h"
#include "util/torch_compat.h"
#include "support/gpu_skip.h"

namespace ckpt = deepspeed::checkpointing;
namespace compat = deepspeed::compat;

namespace {

class GpuCheckpointing : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 1);
    ckpt::configure(ckpt::Options{});
  }
  void TearDown() override { ckpt::configure(ckpt::Options{}); }
};

struct Step {
  torch::Tensor x_grad, w_grad, next_random;
};

// x lives on the CPU; the segment moves it to the GPU and drops half of it there. Without the
// current device's generator saved, the recomputation draws a second mask from the advanced CUDA
// stream: other gradients, and the stream after backward shifted.
Step move_to_gpu_and_dropout(bool checkpointing) {
  torch::manual_seed(5);  // the CPU's and every GPU's generator
  auto w = torch::randn({64, 64}, torch::TensorOptions(torch::kCUDA).requires_grad(true));
  auto x = torch::randn({32, 64}, torch::requires_grad());
  auto segment = [w](const torch::Tensor& in) {
    return torch::dropout(in.to(torch::kCUDA).matmul(w), 0.5, /*train=*/true);
  };
  auto y = checkpointing ? ckpt::checkpoint(segment, x) : segment(x);
  y.pow(2).sum().backward();
  return {x.grad(), w.grad(), torch::rand({16}, torch::kCUDA)};
}

}  // namespace

TEST_F(GpuCheckpointing, CpuInputsMovedToTheGpuDrawTheSameDropoutMasks) {
  SKIP_WITHOUT_GPU();
  const Step plain = move_to_gpu_and_dropout(false);
  const Step checkpointed = move_to_gpu_and_dropout(true);
  EXPECT_TRUE(torch::equal(plain.x_grad, checkpointed.x_grad));
  EXPECT_TRUE(torch::equal(plain.w_grad, checkpointed.w_grad));
  EXPECT_TRUE(torch::equal(plain.next_random, checkpointed.next_random))
      << "the recomputation shifted the CUDA random stream";
}

TEST_F(GpuCheckpointing, RecomputationRunsUnderTheFirstRunsCudaAutocast) {
  SKIP_WITHOUT_GPU();
  auto run = [](bool checkpointing) {
    torch::manual_seed(0);
    torch::nn::Linear lin(64, 64);
    lin->to(torch::kCUDA);
    auto x = torch::randn({32, 64}, torch::TensorOptions(torch::kCUDA).requires_grad(true));
    auto block = [lin](const torch::Tensor& t) mutable { return torch::gelu(lin->forward(t)); };
    torch::Tensor loss;
    {
      const bool was = compat::autocast_enabled(c10::kCUDA);
      const auto dtype = compat::autocast_dtype(c10::kCUDA);
      compat::set_autocast_enabled(c10::kCUDA, true);
      compat::set_autocast_dtype(c10::kCUDA, at::kHalf);
      auto y = checkpointing ? ckpt::checkpoint(block, x) : block(x);
      EXPECT_EQ(y.scalar_type(), at::kHalf);
      loss = y.to(at::kFloat).pow(2).sum();
      compat::set_autocast_enabled(c10::kCUDA, was);
      compat::set_autocast_dtype(c10::kCUDA, dtype);
      at::autocast::clear_cache();
    }
    loss.backward();
    return std::vector<torch::Tensor>{x.grad(), lin->weight.grad(), lin->bias.grad()};
  };
  const auto plain = run(false), checkpointed = run(true);
  for (size_t i = 0; i < plain.size(); ++i)
    EXPECT_TRUE(torch::equal(plain[i], checkpointed[i])) << "gradient " << i << " differs";
}

// cpu_checkpointing keeps a host copy of a GPU input: a later in-place change could not corrupt
// the copy, but it is refused all the same, as without cpu_checkpointing (one behaviour whatever
// the config); so is a segment changing its input in place.
TEST_F(GpuCheckpointing, InPlaceChangesAreRefusedWithCpuCheckpointingToo) {
  SKIP_WITHOUT_GPU();
  ckpt::Options o;
  o.cpu_checkpointing = true;
  ckpt::configure(o);
  auto x = torch::randn({8}, torch::TensorOptions(torch::kCUDA).requires_grad(true));
  auto h = x * 2;
  auto y = ckpt::checkpoint([](const torch::Tensor& t) { return t.sin(); }, h);
  h.add_(1);
  try {
    y.sum().backward();
    ADD_FAILURE() << "an input changed after the checkpoint was recomputed from";
  } catch (const deepspeed::Error& e) {
    EXPECT_NE(std::string(e.what()).find("modified by an inplace operation"), std::string::npos)
        << e.what();
  }
  auto w = torch::ones({8}, torch::TensorOptions(torch::kCUDA).requires_grad(true));
  auto z = torch::ones({8}, torch::kCUDA);
  EXPECT_THROW(ckpt::checkpoint([w](const torch::Tensor& t) { return t.mul_(3) * w; }, z),
               deepspeed::Error);
}
