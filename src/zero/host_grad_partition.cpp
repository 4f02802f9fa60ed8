#include "zero/host_grad_partition.h"

#include <torch/torch.h>

#include <algorithm>

#include "device/pinned_memory.h"
#include "zero/tensor_facts.h"

namespace deepspeed {
namespace zero {

// Zeroed once: a partition read before any backward (a norm asked for early) holds zeros.
HostGradPartition::HostGradPartition(int64_t numel, at::ScalarType dtype, c10::Device device,
                                     bool pin)
    : device_(device), downloads_(device) {
  host_ = device::host_buffer(numel, dtype, pin, device);
  host_.zero_();
  squares_ = torch::zeros({1}, torch::TensorOptions().dtype(torch::kDouble).device(device));
}

HostGradPartition::~HostGradPartition() {
  try {  // a sticky CUDA error throws here too: a destructor must not
    wait();
  } catch (...) {
  }
}

void HostGradPartition::begin_micro_step(bool boundary) {
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
  downloads_.follow_current();  // the bucket's reduction is queued on the compute stream
  downloads_.reads(flat);
  if (overwrite_) overwritten_.emplace_back(begin, n);
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
      at::Tensor sum = at::empty({n}, flat.options().dtype(host_.scalar_type()));
      note_temporary(sum);
      sum.copy_(place, /*non_blocking=*/true);
      sum.add_(flat);
      place.copy_(sum, /*non_blocking=*/true);
      final_values = sum;
    }
    if (boundary_) squares_ += sum_of_squares(final_values);
    fence = downloads_.mark();
  });
  return fence;
}

at::Tensor HostGradPartition::squared_norm() {
  downloads_.join();
  return squares_.clone();
}

// One at a time: each is released as its lambda ends, and the caching allocator hands the block
// to the next one on the same stream.
void HostGradPartition::note_temporary(const at::Tensor& t) {
  peak_temporary_bytes_ = std::max(peak_temporary_bytes_, storage_bytes(t));
}

void HostGradPartition::wait() { downloads_.mark()->wait(); }

void HostGradPartition::clear() {
  overwritten_.clear();
  cleared_ = true;
  in_micro_step_ = false;
}

}  // namespace zero
}  // namespace deepspeed
