// Host<->device copy bandwidth through the path ZeRO-Offload and ZeRO-Infinity use
// (device::SideStream, device/transfer_stream.h): host→device and device→host from page-locked
// memory, each alone and both at once (a GPU has a copy engine per direction; the step during
// backward runs both), and host→device from pageable memory for reference (pin_memory: false).
// With the CPU Adam rate (bench_cpu_adam) these are the floors of an offloaded step, printed by
// bench/gpu/run.sh before its rows.
//
// Usage: bench_transfer [mib=1024] [reps=5] [device=cuda]. Without a GPU it measures host-to-host
// copies through the same code (the CPU build's side stream copies inline) and says so.
#include <fmt/core.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench_args.h"
#include "best_seconds.h"
#include "device/transfer_stream.h"

using deepspeed::device::SideStream;

int main(int argc, char** argv) try {
  const BenchArgs args(argc, argv, "Usage: bench_transfer [mib=1024] [reps=5] [device=cuda]");
  args.at_most(3);
  const int64_t mib = args.number(1, 1024);
  const int reps = static_cast<int>(args.number(2, 5));
  if (mib < 1) args.fail("mib " + std::to_string(mib) + " is not positive");
  const std::string want = args.text(3, "cuda");
  const bool gpu = want.rfind("cuda", 0) == 0 && torch::cuda::is_available();
  const c10::Device device = gpu ? c10::Device(want) : c10::Device(c10::kCPU);
  const int64_t n = mib << 20;  // bytes, as uint8 elements
  const auto host = torch::TensorOptions().dtype(torch::kUInt8);
  at::Tensor pinned_up = torch::ones({n}, host.pinned_memory(gpu));
  at::Tensor pinned_down = torch::empty({n}, host.pinned_memory(gpu));
  at::Tensor pageable = torch::ones({n}, host);
  at::Tensor dev_up = torch::empty({n}, host.device(device));
  at::Tensor dev_down = torch::ones({n}, host.device(device));
  SideStream up(device), down(device);

  const double gb = static_cast<double>(n) / 1e9;
  const double h2d = best_seconds(reps, [&] { up.copy(dev_up, pinned_up)->wait(); });
  const double d2h = best_seconds(reps, [&] { down.copy(pinned_down, dev_down)->wait(); });
  const double both = best_seconds(reps, [&] {
    auto a = up.copy(dev_up, pinned_up);
    auto b = down.copy(pinned_down, dev_down);
    a->wait();
    b->wait();
  });
  const double paged = best_seconds(reps, [&] { up.copy(dev_up, pageable)->wait(); });

  fmt::print("bench_transfer: {} MiB per copy, best of {}, device {}{}\n", mib, reps, device.str(),
             gpu ? "" : " (no GPU: host-to-host copies through the same code)");
  fmt::print("| copy | GB/s |\n|---|---|\n");
  fmt::print("| host→device, pinned | {:.1f} |\n", gb / h2d);
  fmt::print("| device→host, pinned | {:.1f} |\n", gb / d2h);
  fmt::print("| both at once (each way) | {:.1f} |\n", gb / both);
  fmt::print("| host→device, pageable | {:.1f} |\n", gb / paged);
  fmt::print("transfer_report device={} h2d_pinned_gbs={:.2f} d2h_pinned_gbs={:.2f} "
             "both_each_gbs={:.2f} h2d_pageable_gbs={:.2f}\n",
             device.str(), gb / h2d, gb / d2h, gb / both, gb / paged);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_transfer: error: %s\n", e.what());
  return 1;
}
