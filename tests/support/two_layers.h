// Two bias-free 700 x 700 linear layers (980,000 parameters, 3.7 MiB in fp32): with the default
// reduce_bucket_size their one gradient bucket is the only allocation of 3 MiB or more in a
// backward, so an allocator that fails requests of that size (failing_cpu_allocator.h) fails
// exactly the buffer a test names.
#pragma once
#include <torch/torch.h>

namespace dstest {

struct TwoLayersImpl : torch::nn::Module {
  torch::nn::Linear a{nullptr}, b{nullptr};
  TwoLayersImpl() {
    a = register_module("a", torch::nn::Linear(torch::nn::LinearOptions(700, 700).bias(false)));
    b = register_module("b", torch::nn::Linear(torch::nn::LinearOptions(700, 700).bias(false)));
  }
  torch::Tensor forward(torch::Tensor x) { return b(a(x)).pow(2).mean(); }
};

}  // namespace dstest
