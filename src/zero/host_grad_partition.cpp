#include "zero/host_grad_partition.h"

#include <torch/torch.h>

#include <algorithm>

#include "device/out_of_memory.h"
#include "device/pinned_memory.h"
#include "zero/tensor_facts.h"

namespace deepspeed {
namespace zero {
// Zeroed once: a partition read before any backward (a norm asked for early) holds zeros.
HostGradPartition::HostGradPartition(int64_t numel, at::ScalarType dtype, c10::Device device,
                                     bool pin, device::Downloader staged)
    : device_(device), downloads_(device) {
  if (staged) staged_.emplace(std::move(staged));
  {
    AllocatingFor naming("this rank's gradient partition in host memory", -1, numel,
                         c10::elementSize(dtype));
    host_ = device::host_buffer(numel, dtype, pin, device);
  }
  host_.zero_();
  squares_ = torch::zeros({1}, torch::TensorOptions().dtype(torch::kDouble).device(device));
}

HostGradPartition::~HostGradPartition() {
  try {  // a sticky CUDA error throws here too: a destructor must not
    wait();
  } catch (...) {
  }
  cancel_pending();
}

// The staged copies pending will not be put in: whoever waits for them is woken (and throws).
void HostGradPartition::cancel_pending() {
  if (staged_) staged_->for_each_pending([](StagedPlace& p) { p.in_place->cancel(); });
}

void HostGradPartition::begin_micro_step(bool boundary) {
  // The last micro-step's staged copies go in first (in order, before this one's, and before a
  // boundary restarts the squares they may add to): by now they have usually arrived.
  if (staged_) apply_staged(/*wait_all=*/true);
  // The last backward threw after overwriting part of the partition: the rest still holds an
  // earlier step's gradients and is zeroed; the failed micro-step's part is then added to, as it
  // would be in a device partition.
  if (in_micro_step_ && overwrite_) {
    // Taken first: should the ranges overlap (a bug upstream, reported), the next begin starts
    // clean instead of throwing again.
    const std::vector<ElementRange> written = std::move(overwritten_);
    overwritten_.clear();
    in_micro_step_ = false;
    wait();
    for (const auto& [begin, numel] : uncovered(written, host_.numel(), "HostGradPartition"))
      host_.narrow(0, begin, numel).zero_();
  }
  overwritten_.clear();
  overwrite_ = cleared_;
  cleared_ = false;
  boundary_ = boundary;
  in_micro_step_ = true;
  if (boundary) {
    host_squares_ = 0;
    downloads_.follow_current();  // the last boundary's squared_norm() copy has been read
    downloads_.run([&] { squares_.zero_(); });
  }
}

std::shared_ptr<device::CopyFence> HostGradPartition::accumulate(int64_t begin,
                                                                 const at::Tensor& reduced) {
  const int64_t n = reduced.numel();
  TORCH_CHECK(begin >= 0 && begin + n <= host_.numel(), "HostGradPartition: elements [", begin,
              ", ", begin + n, ") outside the partition of ", host_.numel());
  at::Tensor place = host_.narrow(0, begin, n);
  at::Tensor flat = reduced.reshape({-1});
  // A range counts as written once its copy is in (here) or put in (apply_staged): one that
  // failed on the way still holds an earlier step's gradients, which a retry's recovery zeroes.
  if (staged_) return stage(begin, flat);
  downloads_.follow_current();  // the bucket's reduction is queued on the compute stream
  downloads_.reads(flat);
  std::shared_ptr<device::CopyFence> fence;
  downloads_.run([&] {
    at::Tensor final_values;
    if (device_.is_cpu()) {
      if (overwrite_)
        place.copy_(flat);
      else
        place.add_(flat);
      final_values = place;
    } else if (overwrite_) {
      place.copy_(flat, /*non_blocking=*/true);
      // The squares of the values as the partition holds them (a narrower partition rounds).
      final_values = flat;
      if (boundary_ && flat.scalar_type() != host_.scalar_type()) {
        final_values = flat.to(host_.scalar_type());
        note_temporary(final_values);
      }
    } else {
      // Up, add, down, in the partition's dtype (as a device partition adds): a bucket-sized
      // temporary on the GPU, never the partition.
      at::Tensor sum;
      {
        AllocatingFor naming("a bucket's sum with the host gradient partition's range, on the GPU",
                             -1, n, host_.element_size());
        sum = at::empty({n}, flat.options().dtype(host_.scalar_type()));
      }
      note_temporary(sum);
      sum.copy_(place, /*non_blocking=*/true);
      sum.add_(flat);
      place.copy_(sum, /*non_blocking=*/true);
      final_values = sum;
    }
    if (boundary_) squares_ += sum_of_squares(final_values);
    fence = downloads_.mark();
  });
  if (overwrite_) overwritten_.emplace_back(begin, n);
  return fence;
}

// Pageable: the bucket comes down into a page-locked copy. An overwrite's final values are the
// bucket's own, so a boundary sums their squares on the GPU as the direct path does; an add's
// exist only once the host has added, so it sums them there.
std::shared_ptr<device::CopyFence> HostGradPartition::stage(int64_t begin,
                                                             const at::Tensor& flat) {
  if (boundary_ && overwrite_) {
    downloads_.follow_current();
    downloads_.reads(flat);
    downloads_.run([&] {
      at::Tensor final_values = flat;
      if (flat.scalar_type() != host_.scalar_type()) {
        final_values = flat.to(host_.scalar_type());
        note_temporary(final_values);
      }
      squares_ += sum_of_squares(final_values);
    });
  }
  auto in_place = std::make_shared<device::HostFence>();
  staged_->push(flat, StagedPlace{begin, overwrite_, boundary_ && !overwrite_, in_place});
  last_staged_ = in_place;
  apply_staged(/*wait_all=*/false);
  return in_place;
}

void HostGradPartition::apply_staged(bool wait_all) {
  staged_->apply(wait_all, [&](const at::Tensor& values, const StagedPlace& to) {
    try {
      at::Tensor place = host_.narrow(0, to.begin, values.numel());
      if (to.overwrite)
        place.copy_(values);
      else
        place.add_(values);
      if (to.count_squares) host_squares_ += sum_of_squares(place).item<double>();
    } catch (...) {
      to.in_place->cancel();  // never put in: a waiter must not wait for ever
      // Nor written (not in overwritten_): the range may still hold an earlier step's gradients.
      // Zeroed here too, as a retry's recovery would, for a failure after the micro-step ended
      // (in wait() or squared_norm()), which no recovery follows.
      if (to.overwrite) {
        try {
          host_.narrow(0, to.begin, values.numel()).zero_();
        } catch (...) {
        }
      }
      throw;
    }
    if (to.overwrite) overwritten_.emplace_back(to.begin, values.numel());
    to.in_place->signal();
  });
}

// Staged: the copies go in in order, so the newest one's fence covers every copy so far (those
// already in, and the boundary squares' work on the download stream, need no wait).
std::shared_ptr<device::CopyFence> HostGradPartition::written() {
  if (staged_) {
    if (!staged_->empty() && last_staged_) return last_staged_;
    auto done = std::make_shared<device::HostFence>();
    done->signal();
    return done;
  }
  return downloads_.mark();
}

at::Tensor HostGradPartition::squared_norm() {
  if (staged_) apply_staged(/*wait_all=*/true);  // the adds' squares are the host's
  downloads_.join();
  at::Tensor squares = squares_.clone();
  if (host_squares_ != 0) squares += host_squares_;
  return squares;
}

int64_t HostGradPartition::device_temporary_bytes() const {
  // At most: they may meet.
  return peak_temporary_bytes_ + (staged_ ? staged_->peak_device_bytes() : 0);
}

// One at a time: each is released as its lambda ends, and the caching allocator hands the block
// to the next one on the same stream.
void HostGradPartition::note_temporary(const at::Tensor& t) {
  peak_temporary_bytes_ = std::max(peak_temporary_bytes_, storage_bytes(t));
}

void HostGradPartition::wait() {
  if (staged_) apply_staged(/*wait_all=*/true);
  downloads_.mark()->wait();
}

// The gradients are dropped: copies still pending are too (the caching host allocator keeps
// their page-locked blocks until the copies into them are done).
void HostGradPartition::clear() {
  if (staged_) {
    cancel_pending();
    staged_->clear();
    last_staged_.reset();
  }
  overwritten_.clear();
  cleared_ = true;
  in_micro_step_ = false;
}

}  // namespace zero
}  // namespace deepspeed
