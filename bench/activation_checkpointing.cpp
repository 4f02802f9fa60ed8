// Activation checkpointing's trade on the example GPT: peak bytes the CPU allocator hands out
// during one forward + backward, and the step time, with every block checkpointed against the
// same model without (the peer, in the same run). DeepSpeed's rule of thumb for one checkpoint per
// block: about a third more compute (the forward runs twice), activations of one block instead of
// all of them.
//
// Usage: bench_activation_checkpointing [n_layer=8] [n_embd=256] [batch=8] [block=128] [reps=5]
// (one thread: OMP_NUM_THREADS=1 gives repeatable times on this 2-core machine).
#include <fmt/core.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "bench_args.h"
#include "gpt/model.h"
#include "util/allocation_meter.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Row {
  double ms = 1e30;     // best step time
  int64_t peak = 0;     // peak allocated bytes during the step
};

Row measure(gpt::GPTConfig c, bool checkpointing, int64_t batch, int reps) {
  c.activation_checkpointing = checkpointing;
  torch::manual_seed(0);
  gpt::GPT model(c);
  auto idx = torch::randint(0, c.vocab_size, {batch, c.block_size}, torch::kLong);
  auto targets = torch::randint(0, c.vocab_size, {batch, c.block_size}, torch::kLong);
  Row row;
  for (int r = 0; r <= reps; ++r) {  // r = 0: warm-up, untimed
    model->zero_grad();
    deepspeed::util::AllocationMeter meter;
    const auto t0 = Clock::now();
    model->forward(idx, targets).backward();
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (r == 0) continue;
    row.ms = std::min(row.ms, ms);
    row.peak = std::max(row.peak, meter.peak_bytes());
  }
  return row;
}

}  // namespace

int main(int argc, char** argv) try {
  const BenchArgs args(argc, argv,
                       "Usage: bench_activation_checkpointing [n_layer=8] [n_embd=256] [batch=8] "
                       "[block=128] [reps=5]");
  args.at_most(5);
  gpt::GPTConfig c;
  c.n_layer = args.number(1, 8);
  c.n_embd = args.number(2, 256);
  const int64_t batch = args.number(3, 8);
  c.block_size = args.number(4, 128);
  const int reps = static_cast<int>(args.number(5, 5));
  c.n_head = 4;
  torch::set_num_threads(1);

  const Row plain = measure(c, false, batch, reps);
  const Row ckpt = measure(c, true, batch, reps);
  fmt::print("GPT n_layer={} n_embd={} batch={} block={} (fp32, 1 thread, best of {})\n", c.n_layer,
             c.n_embd, batch, c.block_size, reps);
  fmt::print("{:<28} {:>12} {:>16}\n", "", "step ms", "peak alloc MiB");
  fmt::print("{:<28} {:>12.1f} {:>16.1f}\n", "plain (peer)", plain.ms, plain.peak / 1048576.0);
  fmt::print("{:<28} {:>12.1f} {:>16.1f}\n", "every block checkpointed", ckpt.ms,
             ckpt.peak / 1048576.0);
  fmt::print("checkpointing: {:.0f}% of the plain peak, {:+.0f}% step time\n",
             100.0 * ckpt.peak / plain.peak, 100.0 * (ckpt.ms / plain.ms - 1));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_activation_checkpointing: error: %s\n", e.what());
  return 1;
}
