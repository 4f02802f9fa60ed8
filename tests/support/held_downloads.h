// Downloads as a GPU's would arrive, for the CPU suite: each reduced bucket's host copy comes with
// a fence that passes only when the test releases it (or the code under test waits for it, which
// counts as the host blocking). Used by the two gradient homes that take buckets through
// device::Downloader: offload::GradStore and zero::HostGradPartition (pageable).
#pragma once
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "device/download.h"

namespace dstest {

// A download's fence that the test lets pass; a wait() before that is the host blocking (counted),
// after which the copy counts as done.
struct HeldFence : deepspeed::device::CopyFence {
  bool released = false;
  int* blocking_waits;
  explicit HeldFence(int* counter) : blocking_waits(counter) {}
  void wait() override {
    if (!released) ++*blocking_waits;
    released = true;
  }
  bool passed() override { return released; }
  void join_current() override {}
};

// A copy of each bucket, its fence held until released. A meta tensor stands in for a bucket on a
// GPU: it comes down as ones.
struct HeldDownloads {
  int blocking_waits = 0;
  std::vector<std::shared_ptr<HeldFence>> fences;
  deepspeed::device::Downloader downloader() {
    return [this](const at::Tensor& reduced) {
      fences.push_back(std::make_shared<HeldFence>(&blocking_waits));
      at::Tensor host = reduced.is_meta() ? torch::ones({reduced.numel()}) : reduced.clone();
      return deepspeed::device::Download{host, fences.back()};
    };
  }
  void release(size_t i) { fences.at(i)->released = true; }
};

}  // namespace dstest
