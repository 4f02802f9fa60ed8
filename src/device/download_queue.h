// Reduced buckets on their way down from the GPU, put into host memory in the order they were
// queued without stopping the host: each call looks at the oldest copies and applies those that
// have arrived (a fence that has passed), and waits only when more than kMaxDownloadsPending are
// pending, because each holds a bucket-sized page-locked copy and keeps its bucket on the GPU
// allocated until the copy has read it. The two gradient homes in host memory that may be
// pageable share it (offload/grad_store.h, zero/host_grad_partition.h); each says what applying a
// copy means (its `Place`: where the copy goes, and how) and what else it tracks around it.
//
// In order, because a later copy may add to what an earlier one wrote. Not thread-safe: calls
// come one at a time (on a GPU from autograd's device thread during backward, where the stages'
// hooks run, and from the user's thread after it; backward() returning orders the two).
#pragma once
#include <algorithm>
#include <cstdint>
#include <deque>
#include <utility>

#include <ATen/Tensor.h>

#include "device/download.h"

namespace deepspeed {
namespace device {

// Copies pending beyond which the host waits for the oldest.
constexpr size_t kMaxDownloadsPending = 4;

template <class Place>
class DownloadQueue {
 public:
  struct Pending {
    Place place;
    Download download;
    int64_t device_bytes = 0;  // the bucket's storage on the GPU that the copy reads
    int64_t host_bytes = 0;    // the copy (0: the bucket itself, already in host memory)
  };

  explicit DownloadQueue(Downloader download) : download_(std::move(download)) {}

  // Starts `reduced` on its way down to `place`.
  void push(const at::Tensor& reduced, Place place) {
    Pending p{std::move(place), download_(reduced)};
    if (!reduced.is_cpu()) p.device_bytes = bytes_of(reduced);
    if (!p.download.host.is_same(reduced)) p.host_bytes = bytes_of(p.download.host);
    pending_.push_back(std::move(p));
    // Both only grow here: the peaks are reached at a push.
    peak_device_bytes_ = std::max(peak_device_bytes_, device_bytes());
    peak_host_bytes_ = std::max(peak_host_bytes_, host_bytes());
  }

  // apply(host_values, place) for each copy, oldest first: those that have arrived, waiting for
  // the oldest only beyond kMaxDownloadsPending; `wait_all`: every one. A copy stays in the queue
  // (and in its byte counts) while its apply runs, and leaves it even if apply throws: it is
  // never applied twice.
  template <class Apply>
  void apply(bool wait_all, Apply&& apply) {
    while (!pending_.empty()) {
      Pending& oldest = pending_.front();
      if (!wait_all && pending_.size() <= kMaxDownloadsPending &&
          !oldest.download.fence->passed())
        return;
      oldest.download.fence->wait();
      struct PopFront {
        std::deque<Pending>& queue;
        ~PopFront() { queue.pop_front(); }
      } pop{pending_};
      apply(oldest.download.host, oldest.place);
    }
  }

  // Forgets the copies without applying them. The caching host allocator keeps a page-locked
  // block until the copy into it is done, so this need not wait; drop() is for copies into
  // memory that is freed with them.
  void clear() { pending_.clear(); }
  // Waits for each copy, then forgets them all (also when a fence throws, a sticky CUDA error).
  void drop() {
    std::deque<Pending> dropped = std::move(pending_);
    pending_.clear();
    for (auto& p : dropped) p.download.fence->wait();
  }

  // f(place) for each copy still pending, oldest first.
  template <class F>
  void for_each_pending(F&& f) {
    for (auto& p : pending_) f(p.place);
  }

  bool empty() const { return pending_.empty(); }
  size_t size() const { return pending_.size(); }
  // The host copies pending (not a host tensor handed in as it is, which is the caller's).
  int64_t host_bytes() const {
    int64_t total = 0;
    for (const auto& p : pending_) total += p.host_bytes;
    return total;
  }
  // The buckets that copies not yet done keep allocated on the GPU (a passed copy's is freed).
  int64_t device_bytes() const {
    int64_t total = 0;
    for (const auto& p : pending_)
      if (p.device_bytes > 0 && !p.download.fence->passed()) total += p.device_bytes;
    return total;
  }
  int64_t peak_host_bytes() const { return peak_host_bytes_; }
  int64_t peak_device_bytes() const { return peak_device_bytes_; }

 private:
  static int64_t bytes_of(const at::Tensor& t) {
    return t.defined() ? static_cast<int64_t>(t.storage().nbytes()) : 0;
  }

  Downloader download_;
  std::deque<Pending> pending_;
  int64_t peak_host_bytes_ = 0;
  int64_t peak_device_bytes_ = 0;
};

}  // namespace device
}  // namespace deepspeed
