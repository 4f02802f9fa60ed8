// A two-layer regression net with fp16 parameters that computes in fp32, and its data: the fp16
// path of a CUDA build without the Half kernels libtorch 1.13 lacks on CPU (gradients reach the
// parameters in fp16 through the casts). Used by the fp16 loss-scaler and 16-bit 1-bit tests.
#pragma once
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

namespace dstest {

struct HalfMlpImpl : torch::nn::Module {
  HalfMlpImpl() {
    w1 = register_parameter("w1", torch::randn({32, 16}) * 0.3);
    b1 = register_parameter("b1", torch::zeros({32}));
    w2 = register_parameter("w2", torch::randn({4, 32}) * 0.3);
  }
  // Mean squared error of the net on x [B, 16] against y [B, 4].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
    auto h = torch::tanh(x.matmul(w1.to(torch::kFloat).t()) + b1.to(torch::kFloat));
    return (h.matmul(w2.to(torch::kFloat).t()) - y).pow(2).mean();
  }
  torch::Tensor w1, b1, w2;
};
TORCH_MODULE(HalfMlp);

struct HalfMlpBatch {
  torch::Tensor x, y;
};
// Rank- and step-specific batches of 8 from a fixed teacher. Drawn from generators of its own
// (the values torch::manual_seed with the same seeds gives): rank threads call it at once, and
// reseeding the process-wide generator from two threads would mix their draws.
inline HalfMlpBatch half_mlp_batch(int rank, int64_t step) {
  auto teacher = torch::randn({16, 4}, at::detail::createCPUGenerator(1234));
  auto x = torch::randn({8, 16}, at::detail::createCPUGenerator(10000 + 100 * step + rank));
  return {x, torch::tanh(x.matmul(teacher))};
}

}  // namespace dstest
