// inference::DeferredInit: placeholder storage for a model init_inference will load.
//
// Why aliased mappings and not one shared address: ATen refuses ops whose output partially
// overlaps an input (TensorIterator's overlap check compares addresses), so every placeholder
// needs its own virtual range; mapping the same memfd again for each keeps the physical cost at
// the largest request. Why drop page-table entries now and then: Linux counts a shared page
// once per mapping that touched it in the resident set (RssShmem, VmHWM), so without it a
// model built in placeholders would *look* as large as a real one to RSS, to /usr/bin/time and
// to the OOM killer's score, although it occupies one tensor's pages.
#include "tp/deferred_init.h"

#include <c10/core/CPUAllocator.h>
#include <torch/version.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_set>

#include "deepspeed/inference.h"
#include "util/torch_compat.h"

namespace deepspeed {
namespace tp {

AllocatorSwap install_cpu_allocator(at::Allocator* a) {
  AllocatorSwap swap{c10::GetCPUAllocator(), 0};
  for (int p = 0; p <= 255; ++p) {  // the first that takes is the installed one's priority
    c10::SetCPUAllocator(a, static_cast<uint8_t>(p));
    if (c10::GetCPUAllocator() == a) {
      swap.priority = static_cast<uint8_t>(p);
      return swap;
    }
  }
  throw std::logic_error("install_cpu_allocator: c10 refused the allocator at every priority");
}

void restore_cpu_allocator(at::Allocator* installed, const AllocatorSwap& swap) {
  if (c10::GetCPUAllocator() == installed) c10::SetCPUAllocator(swap.previous, swap.priority);
}

}  // namespace tp

namespace inference {
namespace {

thread_local int t_depth = 0;  // DeferredInit scopes alive on this thread

struct Mapping {
  void* addr;
  size_t len;
};

void release_placeholder(void* ctx);

// Placeholders for threads inside a scope, the replaced allocator's memory for everyone else.
// One instance, never destroyed: tensors may outlive every scope, and c10 keeps the pointer.
class PlaceholderAllocator final : public compat::HostAllocator {
 public:
  at::DataPtr allocate(size_t n) DS_ALLOCATE_CONST override {
    if (t_depth == 0 || n == 0) return real_.load()->allocate(n);
    return const_cast<PlaceholderAllocator*>(this)->place(n);
  }
  // Only the replaced allocator's DataPtrs may be raw-deallocated (a placeholder's context is
  // its Mapping, so raw_allocate's check refuses one inside a scope).
  at::DeleterFnPtr raw_deleter() const override { return real_.load()->raw_deleter(); }

  void enter() {
    std::lock_guard<std::mutex> lock(mu_);
    if (scopes_ == 0) {  // the first scope of an epoch: a new file, the allocator installed
      const int fd = memfd_create("deepspeed-deferred-init", MFD_CLOEXEC);
      TORCH_CHECK(fd >= 0, "DeferredInit: memfd_create failed: ", std::strerror(errno));
      const auto current = c10::GetCPUAllocator();
      if (current != this) real_ = current;  // serves every request but this epoch's scopes'
      try {
        swap_ = tp::install_cpu_allocator(this);
      } catch (...) {
        ::close(fd);
        throw;
      }
      swap_.previous = real_;
      fd_ = fd;
      file_size_ = 0;
    }
    ++scopes_;
  }

  void exit() {
    std::lock_guard<std::mutex> lock(mu_);
    drop_page_tables();
    if (--scopes_ > 0) return;
    tp::restore_cpu_allocator(this, swap_);
    ::close(fd_);  // live placeholders keep the file; its pages go with the last of them
    fd_ = -1;
  }

  void release(Mapping* m) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      live_.erase(m);
    }
    ::munmap(m->addr, m->len);
    delete m;
  }

 private:
  at::DataPtr place(size_t n) {
    static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    const size_t len = (n + page - 1) / page * page;
    std::lock_guard<std::mutex> lock(mu_);
    if (len > file_size_) {  // grow only: shrinking under live mappings would fault them
      TORCH_CHECK(::ftruncate(fd_, static_cast<off_t>(len)) == 0, "DeferredInit: growing the ",
                  "placeholder file to ", len, " bytes failed: ", std::strerror(errno));
      file_size_ = len;
    }
    void* addr = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    TORCH_CHECK(addr != MAP_FAILED, "DeferredInit: mapping a placeholder of ", n,
                " bytes failed: ", std::strerror(errno), " (vm.max_map_count limits how many)");
    auto* m = new Mapping{addr, len};
    live_.insert(m);
    // Budget: at least the largest request, so the scans stay rare (model bytes / largest).
    since_drop_ += len;
    if (since_drop_ >= std::max<size_t>(file_size_, 16u << 20)) drop_page_tables();
    return at::DataPtr(addr, m, &release_placeholder, at::Device(at::kCPU));
  }

  // The pages stay in the file (MADV_DONTNEED on a shared mapping only unmaps them); a later
  // write faults them in again.
  void drop_page_tables() {
    for (Mapping* m : live_) ::madvise(m->addr, m->len, MADV_DONTNEED);
    since_drop_ = 0;
  }

  std::mutex mu_;
  std::atomic<at::Allocator*> real_{nullptr};
  tp::AllocatorSwap swap_;
  int scopes_ = 0;  // over all threads
  int fd_ = -1;
  size_t file_size_ = 0;
  size_t since_drop_ = 0;
  std::unordered_set<Mapping*> live_;
};

PlaceholderAllocator& placeholders() {
  static auto* a = new PlaceholderAllocator();
  return *a;
}

void release_placeholder(void* ctx) { placeholders().release(static_cast<Mapping*>(ctx)); }

}  // namespace

DeferredInit::DeferredInit() {
  placeholders().enter();
  ++t_depth;
}

DeferredInit::~DeferredInit() {
  --t_depth;
  placeholders().exit();
}

bool DeferredInit::active() { return t_depth > 0; }

bool is_deferred(const at::Tensor& t) {
  return t.defined() && t.has_storage() &&
         t.storage().data_ptr().get_deleter() == &release_placeholder;
}

}  // namespace inference
}  // namespace deepspeed
