#include "util/allocation_meter.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include "deepspeed/errors.h"
#include "util/torch_compat.h"

namespace deepspeed {
namespace util {

struct AllocationMeter::Counters {
  std::atomic<int64_t> current{0};
  std::atomic<int64_t> peak{0};
  void add(int64_t n) {
    const int64_t now = current.fetch_add(n) + n;
    int64_t p = peak.load();
    while (now > p && !peak.compare_exchange_weak(p, now)) {
    }
  }
};

namespace {

// One counted allocation: the base allocator's DataPtr, kept to free it through its own deleter.
struct Allocation {
  c10::DataPtr inner;
  int64_t bytes;
  std::shared_ptr<AllocationMeter::Counters> counters;
};

// The live allocations by data pointer. The DataPtr's context must be its data pointer (libtorch's
// raw_allocate asserts it, and some kernels allocate scratch space that way), so the deleter finds
// its record here.
struct Ledger {
  std::mutex mutex;
  std::unordered_map<void*, Allocation> live;
};
Ledger& ledger() {
  static Ledger* l = new Ledger();  // never destroyed: frees may come during static destruction
  return *l;
}

void free_counted(void* data) {
  Allocation a;
  {
    Ledger& l = ledger();
    std::lock_guard<std::mutex> lock(l.mutex);
    auto it = l.live.find(data);
    if (it == l.live.end()) return;
    a = std::move(it->second);
    l.live.erase(it);
  }
  a.counters->current.fetch_sub(a.bytes);
  // `a.inner` frees the memory through the base allocator's deleter as it goes out of scope.
}

class CountingAllocator : public compat::HostAllocator {
 public:
  CountingAllocator(c10::Allocator* base, std::shared_ptr<AllocationMeter::Counters> counters)
      : base_(base), counters_(std::move(counters)) {}

  c10::DataPtr allocate(size_t n) DS_ALLOCATE_CONST override {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    const c10::Device device = inner.device();
    if (data == nullptr) return inner;  // zero bytes: nothing to count
    counters_->add(static_cast<int64_t>(n));
    {
      Ledger& l = ledger();
      std::lock_guard<std::mutex> lock(l.mutex);
      l.live[data] = Allocation{std::move(inner), static_cast<int64_t>(n), counters_};
    }
    return {data, data, &free_counted, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_counted; }

 private:
  c10::Allocator* base_;
  std::shared_ptr<AllocationMeter::Counters> counters_;
};

std::atomic<bool> g_installed{false};
// Above the priorities libtorch's own CPU allocators register with, so ours is the one used.
constexpr uint8_t kPriority = 200;

}  // namespace

AllocationMeter::AllocationMeter() : counters_(std::make_shared<Counters>()) {
  if (g_installed.exchange(true)) throw Error("AllocationMeter: another meter is alive");
  previous_ = c10::GetCPUAllocator();
  allocator_ = std::make_unique<CountingAllocator>(previous_, counters_);
  c10::SetCPUAllocator(allocator_.get(), kPriority);
}

AllocationMeter::~AllocationMeter() {
  c10::SetCPUAllocator(previous_, kPriority);
  // The counting allocator object stays alive: tensors it handed out free through their own
  // deleter (Allocation::free), which does not need it, but libtorch may still hold the pointer
  // in places that cached GetCPUAllocator(); a few bytes leaked per meter is the safe side.
  allocator_.release();
  g_installed = false;
}

int64_t AllocationMeter::current_bytes() const { return counters_->current.load(); }
int64_t AllocationMeter::peak_bytes() const { return counters_->peak.load(); }
void AllocationMeter::reset_peak() { counters_->peak = counters_->current.load(); }

}  // namespace util
}  // namespace deepspeed
