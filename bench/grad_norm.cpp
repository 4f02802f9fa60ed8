// The gradient norm's sum of squares (zero::sum_of_squares, behind clipping and the fp16
// overflow vote of every stage) against what PyTorch code would write for it, on one partition:
//   - t.to(double).pow(2).sum(): the whole tensor widened (16 bytes an element of temporaries);
//   - chunks of 2^18 widened one at a time (this library's CPU path before the one-pass loop);
//   - at::linalg_vector_norm in the tensor's own dtype (what clip_grad_norm_ does, fp32 sums
//     for bf16), squared.
// Usage: bench_grad_norm [million_elements=10] [reps=7] [device=cpu]. Run with OMP_NUM_THREADS=1
// for one core's figure (docs/benchmarks.md "Gradient norm in host memory").
#include <fmt/core.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "bench_args.h"
#include "best_seconds.h"
#include "zero/tensor_facts.h"

namespace {

double chunked_widening(const at::Tensor& t) {
  constexpr int64_t kChunk = int64_t{1} << 18;
  at::Tensor sum = at::zeros({}, t.options().dtype(at::kDouble));
  const int64_t n = t.numel();
  for (int64_t b = 0; b < n; b += kChunk)
    sum.add_(t.narrow(0, b, std::min(kChunk, n - b)).to(at::kDouble).pow(2).sum());
  return sum.item<double>();
}

}  // namespace

int main(int argc, char** argv) try {
  const BenchArgs args(argc, argv,
                       "Usage: bench_grad_norm [million_elements=10] [reps=7] [device=cpu]");
  args.at_most(3);
  const int64_t millions = args.number(1, 10);
  const int reps = static_cast<int>(args.number(2, 7));
  if (millions < 1) args.fail("million_elements " + std::to_string(millions) + " is not positive");
  const c10::Device device(args.text(3, "cpu"));
  const int64_t n = millions * 1000000;
  fmt::print("bench_grad_norm: {}M elements on {}, {} thread(s), best of {}\n", millions,
             device.str(), at::get_num_threads(), reps);
  fmt::print("| dtype | sum_of_squares ms | whole tensor widened ms | chunks widened ms | "
             "linalg_vector_norm ms | sum_of_squares GB/s | relative difference |\n"
             "|---|---|---|---|---|---|---|\n");
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    torch::manual_seed(1);
    const at::Tensor t = torch::randn({n}, at::TensorOptions().device(device)).to(dtype);
    double ours = 0, whole = 0;
    const double s_ours =
        best_seconds(reps, [&] { ours = deepspeed::zero::sum_of_squares(t).item<double>(); });
    const double s_whole =
        best_seconds(reps, [&] { whole = t.to(at::kDouble).pow(2).sum().item<double>(); });
    const double s_chunks = best_seconds(reps, [&] { chunked_widening(t); });
    const double s_norm = best_seconds(reps, [&] { at::linalg_vector_norm(t).item<double>(); });
    const double gb = static_cast<double>(t.numel() * t.element_size()) / 1e9;
    fmt::print("| {} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.1f} | {:.1e} |\n",
               c10::toString(dtype), s_ours * 1e3, s_whole * 1e3, s_chunks * 1e3, s_norm * 1e3,
               gb / s_ours, std::abs(ours - whole) / whole);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_grad_norm: %s\n", e.what());
  return 1;
}
