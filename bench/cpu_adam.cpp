// Throughput of the CPU Adam kernel against libtorch's AdamW and against the memory-bandwidth
// bound measured in the same run. An Adam step moves 28 bytes per element (reads param, grad,
// exp_avg, exp_avg_sq: 16; writes param, exp_avg, exp_avg_sq: 12). The bound is measured with
// exactly that traffic and no arithmetic (the "same traffic" kernel: the same four arrays, the
// three written in place), so no implementation can beat it; STREAM-like copy and triad figures
// are printed for reference (they count no write-allocate traffic, so they understate what an
// in-place update can reach).
//
// Usage: bench_cpu_adam [log2_n=24] [reps=10]; threads: OMP_NUM_THREADS (the "all" rows).
#include <fmt/core.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench_args.h"
#include "best_seconds.h"
#include "optim/cpu_adam.h"

namespace {

using deepspeed::optim::AdamStepParams;


// Runs body(begin, end) over [0, n) split evenly across `threads` std::threads (the bench is
// not built with OpenMP; the library is).
template <typename Body>
void split(int threads, int64_t n, Body&& body) {
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] { body(n * t / threads, n * (t + 1) / threads); });
  }
  for (auto& th : pool) th.join();
}

// Cloned per ISA so the bound is measured with the widest loads this CPU has, like the kernel.
__attribute__((target_clones("avx512f", "avx2", "default"))) void triad(float* a, const float* b,
                                                                         const float* c,
                                                                         int64_t n) {
  for (int64_t i = 0; i < n; ++i) a[i] = b[i] + 0.5f * c[i];
}

// Adam's memory traffic without its arithmetic: reads p, g, m, v and writes p, m, v in place.
__attribute__((target_clones("avx512f", "avx2", "default"))) void same_traffic(
    float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
    float* __restrict__ v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = g[i];
    p[i] += x;
    m[i] += x;
    v[i] += x;
  }
}

struct Bandwidth {
  double copy_gbs, triad_gbs;
  double adam_traffic_gbs;  // the limit: 28 B/elem moved by same_traffic over the kernel's n
};

// STREAM-like copy (8 B/elem) and triad a = b + s*c (12 B/elem) over 3 x 256 MiB.
Bandwidth measure_bandwidth(int64_t adam_n, int threads, int reps) {
  Bandwidth out;
  {
    std::vector<float> p(adam_n, 0.5f), g(adam_n, 0.0f), m(adam_n, 0.0f), v(adam_n, 0.0f);
    const double s = best_seconds(reps, [&] {
      split(threads, adam_n, [&](int64_t lo, int64_t hi) {
        same_traffic(p.data() + lo, g.data() + lo, m.data() + lo, v.data() + lo, hi - lo);
      });
    });
    out.adam_traffic_gbs = 28.0 * adam_n / s / 1e9;
  }
  const int64_t n = int64_t{1} << 26;
  std::vector<float> a(n, 1.0f), b(n, 2.0f), c(n, 3.0f);
  const double copy_s = best_seconds(reps, [&] {
    split(threads, n, [&](int64_t lo, int64_t hi) {
      std::memcpy(a.data() + lo, b.data() + lo, (hi - lo) * sizeof(float));
    });
  });
  const double triad_s = best_seconds(reps, [&] {
    split(threads, n, [&](int64_t lo, int64_t hi) {
      triad(a.data() + lo, b.data() + lo, c.data() + lo, hi - lo);
    });
  });
  out.copy_gbs = 8.0 * n / copy_s / 1e9;
  out.triad_gbs = 12.0 * n / triad_s / 1e9;
  return out;
}

struct Row {
  std::string impl;
  int threads;
  double elems_per_s;
  double bytes_per_elem;
  double limit_gbs;
};

void print_row(const Row& r) {
  const double gbs = r.elems_per_s * r.bytes_per_elem / 1e9;
  const double limit = r.limit_gbs * 1e9 / r.bytes_per_elem;
  fmt::print("| {} | {} | {:.3g} | {:.1f} | {:.0f}% |\n", r.impl, r.threads, r.elems_per_s, gbs,
             100.0 * r.elems_per_s / limit);
}

// One timed configuration of adam_step: the fp32 state of n elements and the hyperparameters,
// each rep one more step; `run` does the step with the state's buffers.
struct AdamBench {
  std::vector<float> p, m, v;
  AdamStepParams hp;
  AdamBench(int64_t n, int threads) : p(n, 0.5f), m(n, 0.0f), v(n, 0.0f) {
    hp.weight_decay = 0.01f;
    hp.num_threads = threads;
  }
  template <typename Step>
  double elements_per_second(int reps, Step run) {
    int64_t step = 0;
    const double s = best_seconds(reps, [&] {
      hp.step = ++step;
      run();
    });
    return static_cast<double>(p.size()) / s;
  }
};

double our_kernel(int64_t n, int threads, int reps, bool bf16_copy) {
  AdamBench b(n, threads);
  std::vector<float> g(n, 0.01f);
  std::vector<uint16_t> p16(bf16_copy ? n : 0);
  return b.elements_per_second(reps, [&] {
    deepspeed::optim::adam_step(b.p.data(), g.data(), b.m.data(), b.v.data(), n, b.hp,
                                bf16_copy ? p16.data() : nullptr);
  });
}

// ZeRO-Offload's path with a bf16 model: bf16 gradients in (widened in cache), the bf16 copy
// out: param, m, v read and written (24 bytes an element), the gradient read (2), the copy
// written (2): 28, as the fp32-gradient step without its copy.
double offload_bf16_path(int64_t n, int threads, int reps) {
  AdamBench b(n, threads);
  std::vector<uint16_t> g16(n, 0x3C24), p16(n);  // 0x3C24: bf16 ~0.01
  return b.elements_per_second(reps, [&] {
    deepspeed::optim::adam_step_bf16_grad(b.p.data(), g16.data(), b.m.data(), b.v.data(), n,
                                          b.hp, p16.data());
  });
}

// What ZeRO-Offload's worker does today with bf16 gradients: libtorch widens a 4M-element chunk
// into a scratch buffer (its own parallel pass), then adam_step with the bf16 copy; the row
// above is the alternative that widens 32K elements at a time in each thread's cache.
double offload_bf16_scratch_path(int64_t n, int threads, int reps) {
  at::set_num_threads(threads);
  constexpr int64_t kScratch = int64_t{1} << 22;  // zero/step_during_backward's chunk
  AdamBench b(n, threads);
  at::Tensor g16 = at::full({n}, 0.01, at::kBFloat16);
  at::Tensor scratch = at::empty({std::min(n, kScratch)}, at::kFloat);
  std::vector<uint16_t> p16(n);
  return b.elements_per_second(reps, [&] {
    for (int64_t off = 0; off < n; off += kScratch) {
      const int64_t c = std::min(kScratch, n - off);
      at::Tensor wide = scratch.narrow(0, 0, c);
      wide.copy_(g16.narrow(0, off, c));
      deepspeed::optim::adam_step(b.p.data() + off, wide.data_ptr<float>(), b.m.data() + off,
                                  b.v.data() + off, c, b.hp, p16.data() + off);
    }
  });
}

// The ZeRO stages' mixed-precision step on the CPU before 2026-12-01: the whole bf16 gradient
// partition widened by libtorch into a fresh fp32 copy (4 bytes an element allocated, written
// and read again), then adam_step with the bf16 copy. Since then FusedAdam reads the bf16
// partition as the "widened in cache" row does.
double whole_partition_widened_path(int64_t n, int threads, int reps) {
  at::set_num_threads(threads);
  AdamBench b(n, threads);
  at::Tensor g16 = at::full({n}, 0.01, at::kBFloat16);
  std::vector<uint16_t> p16(n);
  return b.elements_per_second(reps, [&] {
    at::Tensor wide = g16.to(at::kFloat);
    deepspeed::optim::adam_step(b.p.data(), wide.data_ptr<float>(), b.m.data(), b.v.data(), n,
                                b.hp, p16.data());
  });
}

// Low-precision masters (DeepSpeed's bf16/fp16_master_weights_and_grads, bf16_optimizer_states):
// 16-bit master and gradient, moments in fp32 or bf16, widened in cache and rounded back
// (adam_step_buffers). Bytes an element: master 2 + 2, gradient 2, moments 4 + 4 each (fp32) or
// 2 + 2 each (bf16): 22 or 14.
double low_precision_path(int64_t n, int threads, int reps, deepspeed::optim::AdamElem master,
                          deepspeed::optim::AdamElem moments) {
  using deepspeed::optim::AdamElem;
  AdamBench b(0, threads);
  // 0x3C24 is bf16 ~0.01 and 0x211F fp16 ~0.01; the master 0.5 in each.
  const bool fp16 = master == AdamElem::FP16;
  std::vector<uint16_t> p16(n, fp16 ? 0x3800 : 0x3F00), g16(n, fp16 ? 0x211F : 0x3C24);
  std::vector<float> m32(moments == AdamElem::F32 ? n : 0), v32(m32.size());
  std::vector<uint16_t> m16(moments == AdamElem::F32 ? 0 : n), v16(m16.size());
  deepspeed::optim::AdamBuffers buffers;
  buffers.param = p16.data();
  buffers.param_format = master;
  buffers.exp_avg = moments == AdamElem::F32 ? static_cast<void*>(m32.data()) : m16.data();
  buffers.exp_avg_sq = moments == AdamElem::F32 ? static_cast<void*>(v32.data()) : v16.data();
  buffers.moment_format = moments;
  int64_t step = 0;
  const double s = best_seconds(reps, [&] {
    b.hp.step = ++step;
    deepspeed::optim::adam_step_buffers(buffers, g16.data(), master, n, b.hp);
  });
  return static_cast<double>(n) / s;
}

double torch_adamw(int64_t n, int threads, int reps) {
  at::set_num_threads(threads);
  torch::Tensor p = torch::full({n}, 0.5f).requires_grad_(true);
  p.mutable_grad() = torch::full({n}, 0.01f);
  torch::optim::AdamW opt({p}, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  const double s = best_seconds(reps, [&] { opt.step(); });
  return n / s;
}

}  // namespace

int main(int argc, char** argv) try {
  const BenchArgs args(argc, argv, "Usage: bench_cpu_adam [log2_n=24] [reps=10]");
  args.at_most(2);
  const int log2n = static_cast<int>(args.number(1, 24));
  const int reps = static_cast<int>(args.number(2, 10));
  if (log2n < 0 || log2n > 40) args.fail("log2_n " + std::to_string(log2n) + " is outside 0..40");
  const int64_t n = int64_t{1} << log2n;
  const int all = at::get_num_threads();
  std::vector<int> counts = {1};
  if (all > 1) counts.push_back(all);

  fmt::print("n = 2^{} fp32 elements, kernel isa = {}, best of {} reps\n\n", log2n,
             deepspeed::optim::adam_kernel_isa(), reps);
  std::vector<Row> rows;
  for (int t : counts) {
    const Bandwidth bw = measure_bandwidth(n, t, reps);
    const double limit = bw.adam_traffic_gbs;
    fmt::print("memory bandwidth, {} thread(s): Adam's traffic without math {:.1f} GB/s -> limit "
               "{:.3g} Adam elements/s (for reference: copy {:.1f} GB/s, triad {:.1f} GB/s, "
               "STREAM counting)\n",
               t, limit, limit * 1e9 / 28, bw.copy_gbs, bw.triad_gbs);
    rows.push_back({"same traffic, no math (limit: 28 B/elem)", t, limit * 1e9 / 28, 28, limit});
    rows.push_back({"deepspeed::optim::adam_step", t, our_kernel(n, t, reps, false), 28, limit});
    rows.push_back({"adam_step + fused bf16 copy", t, our_kernel(n, t, reps, true), 30, limit});
    rows.push_back({"offload today: bf16 grads widened by libtorch, bf16 copy", t,
                    offload_bf16_scratch_path(n, t, reps), 28, limit});
    rows.push_back({"bf16 grads widened in cache, bf16 copy", t, offload_bf16_path(n, t, reps),
                    28, limit});
    rows.push_back({"ZeRO step before 2026-12-01: whole bf16 partition widened to a copy, bf16 copy",
                    t, whole_partition_widened_path(n, t, reps), 28, limit});
    using deepspeed::optim::AdamElem;
    rows.push_back({"bf16 masters, fp32 moments, bf16 grads (bf16_master_weights_and_grads)", t,
                    low_precision_path(n, t, reps, AdamElem::BF16, AdamElem::F32), 22, limit});
    rows.push_back({"bf16 masters, bf16 moments, bf16 grads (+ bf16_optimizer_states)", t,
                    low_precision_path(n, t, reps, AdamElem::BF16, AdamElem::BF16), 14, limit});
    rows.push_back({"fp16 masters, fp32 moments, fp16 grads (fp16_master_weights_and_grads)", t,
                    low_precision_path(n, t, reps, AdamElem::FP16, AdamElem::F32), 22, limit});
    rows.push_back({"torch::optim::AdamW", t, torch_adamw(n, t, reps), 28, limit});
  }
  fmt::print("\n| implementation | threads | elements/s | GB/s effective | % of bandwidth limit |\n");
  fmt::print("|---|---|---|---|---|\n");
  for (const Row& r : rows) print_row(r);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_cpu_adam: error: %s\n", e.what());
  return 1;
}
