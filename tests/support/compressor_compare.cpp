#include "support/compressor_compare.h"

#include <algorithm>

#include <ATen/CPUGeneratorImpl.h>

namespace dstest {

std::vector<torch::Tensor> compressor_inputs(const std::vector<int64_t>& sizes, uint64_t seed,
                                             bool plus_minus_one) {
  std::vector<torch::Tensor> xs;
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto gen = at::detail::createCPUGenerator(seed + i);
    torch::Tensor x = torch::randn({sizes[i]}, gen);
    xs.push_back(plus_minus_one ? torch::where(x >= 0, 1.0f, -1.0f).to(torch::kFloat)
                                : torch::where(x >= 0, x + 0.01, x - 0.01));
  }
  return xs;
}

void compare_compressor_paths(deepspeed::optim::CompressedAllReduce& reference,
                              deepspeed::optim::CompressedAllReduce& other,
                              const std::vector<torch::Tensor>& inputs, bool exact,
                              const std::string& call, std::vector<std::string>& failures) {
  const c10::Device device = other.worker_error().device();
  std::vector<torch::Tensor> want, got;
  double input_scale = 0;
  for (const auto& x : inputs) {
    input_scale = std::max(input_scale, x.abs().max().item<double>());
    want.push_back(x.cpu().clone());
    got.push_back(x.to(device, /*non_blocking=*/false, /*copy=*/true));
  }
  reference.run(want);
  // On a device, run() itself: its dispatch is to choose the tensor operations there.
  if (device.is_cpu()) {
    other.run_with_tensor_ops(got);
  } else {
    other.run(got);
  }
  auto check = [&](const std::string& what, const torch::Tensor& w, const torch::Tensor& g) {
    if (g.device() != device)
      failures.push_back(call + ": " + what + " is on " + g.device().str() + ", not " + device.str());
    const torch::Tensor d = (w.cpu() - g.cpu()).abs();
    // The inputs' scale is the floor: at world size 1 the server error is only rounding (the
    // server recompresses values that are all one scale), and two paths' rounding differ by
    // as much as that error's own largest element. That check is then loose (1e-5 of the
    // inputs, the error itself ~1e-7), but the outputs' and the worker error's are not: a layout
    // slip moves those by the inputs' size.
    const double largest = std::max(w.abs().max().item<double>(), input_scale);
    const double diff = d.max().item<double>();
    const int64_t off = d.gt(1e-5 * largest).sum().item<int64_t>();
    if (exact ? diff != 0.0 : off > 2)
      failures.push_back(call + ": " + what + " differs by up to " + std::to_string(diff) + " (" +
                         std::to_string(off) + " elements beyond 1e-5 of the largest, " +
                         std::to_string(largest) + ")");
  };
  for (size_t i = 0; i < want.size(); ++i) check("tensor " + std::to_string(i), want[i], got[i]);
  check("worker error", reference.worker_error(), other.worker_error());
  check("server error", reference.server_error(), other.server_error());
}

}  // namespace dstest
