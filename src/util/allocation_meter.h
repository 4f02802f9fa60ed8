// Counts the bytes libtorch allocates on the CPU while a meter is alive: current and peak. The
// CPU has no caching allocator with statistics (as CUDA has), and peak RSS cannot tell a few
// megabytes of activations from the allocator's reuse; this wraps the CPU allocator instead.
// Used by tests and benchmarks (activation checkpointing's saving is measured with it).
// One meter at a time per process; tensors allocated before it are not counted.
#pragma once
#include <cstdint>
#include <memory>

namespace c10 {
struct Allocator;
}

namespace deepspeed {
namespace util {

class AllocationMeter {
 public:
  AllocationMeter();   // installs the counting allocator
  ~AllocationMeter();  // puts the previous allocator back
  AllocationMeter(const AllocationMeter&) = delete;
  AllocationMeter& operator=(const AllocationMeter&) = delete;

  int64_t current_bytes() const;
  int64_t peak_bytes() const;
  // Starts a new peak from the current level.
  void reset_peak();

  struct Counters;

 private:
  std::shared_ptr<Counters> counters_;  // shared with live allocations, which may outlive the meter
  std::unique_ptr<c10::Allocator> allocator_;
  c10::Allocator* previous_ = nullptr;
};

}  // namespace util
}  // namespace deepspeed
