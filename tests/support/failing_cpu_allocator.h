// Out of host memory at a chosen point of a CPU test: while armed, an allocation of at least
// `limit_bytes` fails as libtorch's CPU allocator fails when memory runs out (its c10::Error and
// message); smaller ones, and every one while disarmed, go to the allocator it wraps.
#pragma once
#include <atomic>
#include <cstddef>
#include <memory>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include "util/torch_compat.h"

namespace dstest {

class FailingCpuAllocator : public deepspeed::compat::HostAllocator {
 public:
  explicit FailingCpuAllocator(size_t limit_bytes)
      : base_(c10::GetCPUAllocator()), limit_(limit_bytes) {}

  c10::DataPtr allocate(size_t n) DS_ALLOCATE_CONST override {
    TORCH_CHECK(!armed_ || n < limit_,
                "DefaultCPUAllocator: can't allocate memory: you tried to allocate ", n,
                " bytes. Error code 12 (Cannot allocate memory)");
    return base_->allocate(n);  // freed through the wrapped allocator's own deleter
  }
  c10::DeleterFnPtr raw_deleter() const override { return base_->raw_deleter(); }

  void arm() { armed_ = true; }
  void disarm() { armed_ = false; }
  c10::Allocator* base() const { return base_; }

 private:
  c10::Allocator* base_;
  size_t limit_;
  std::atomic<bool> armed_{false};
};

// Installs a FailingCpuAllocator for its lifetime (above libtorch's own priorities).
class FailingCpuAllocatorScope {
 public:
  explicit FailingCpuAllocatorScope(size_t limit_bytes)
      : allocator_(new FailingCpuAllocator(limit_bytes)) {
    c10::SetCPUAllocator(allocator_, kPriority);
  }
  ~FailingCpuAllocatorScope() {
    // Left alive, as util::AllocationMeter leaves its own: libtorch may have cached the pointer.
    c10::SetCPUAllocator(allocator_->base(), kPriority);
  }
  FailingCpuAllocator& operator*() { return *allocator_; }
  FailingCpuAllocator* operator->() { return allocator_; }

 private:
  static constexpr uint8_t kPriority = 200;
  FailingCpuAllocator* allocator_;
};

}  // namespace dstest
