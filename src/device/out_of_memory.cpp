#include "device/out_of_memory.h"

#include <atomic>
#include <cstdio>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "deepspeed/device.h"
#include "util/host_allocator.h"

namespace deepspeed {
namespace {

// Kept per thread and taken process-wide: on a GPU autograd runs the stages' hooks (bucket and
// unit allocations among them) on its own device thread, while the engine reports on the
// caller's. A thread's record is the innermost scope its exception left. A report takes the
// caller's own record when it has one, else the newest made since the caller's engine call began
// (autograd's device thread's). Ranks running as threads of one process (tests) each start and
// report their own calls at once: forgetting and taking touch no other rank's record, and one
// rank's report never takes another's while it has its own.
struct FailedAllocation {
  std::string named;
  uint64_t order = 0;  // when it was made, process-wide
};
std::mutex failed_allocation_mutex;
std::map<std::thread::id, FailedAllocation> failed_allocations;
uint64_t failed_allocations_made = 0;
std::atomic<bool> failed_allocation_kept{false};  // a record is there (read without the lock)
// Per calling thread: records made up to this order are older than its current engine call.
thread_local uint64_t reported_up_to = 0;

// In GiB, or MiB below one.
std::string gib(double bytes) {
  char text[32];
  if (bytes < 1073741824.0)
    std::snprintf(text, sizeof text, "%.1f MiB", bytes / 1048576.0);
  else
    std::snprintf(text, sizeof text, "%.2f GiB", bytes / 1073741824.0);
  return text;
}

// The part of libtorch's message that says what was asked. CUDA's caching allocator: its first
// sentence ("CUDA out of memory. Tried to allocate 2.00 GiB"; the rest is allocator tuning
// advice). The CPU allocator: "you tried to allocate N bytes".
std::string bytes_asked(const std::string& message) {
  const std::string cpu = "you tried to allocate ";
  if (auto at = message.find(cpu); at != std::string::npos) {
    try {
      return "tried to allocate " + gib(std::stod(message.substr(at + cpu.size())));
    } catch (const std::exception&) {
    }
  }
  std::string asked = message;
  if (auto cut = asked.find(" of which"); cut != std::string::npos) asked = asked.substr(0, cut);
  return asked;
}

// What frees the memory that ran out. Offloading to "cpu" moves GPU bytes into host memory:
// for host memory it is "nvme" that helps, and malloc's own keeping of freed memory is named.
std::string hint(int zero_stage, c10::Device device, bool gpu, bool host) {
  const std::string offload = gpu ? "\"cpu\"" : "\"nvme\"";
  std::string h = zero_stage < 3 ? "a higher zero_optimization.stage, \"offload_optimizer\": "
                                   "{\"device\": " + offload + "}"
                                 : "\"offload_param\" and \"offload_optimizer\" to " +
                                       std::string(gpu ? "\"cpu\" or \"nvme\"" : "\"nvme\"") +
                                       ", lower stage3_max_live_parameters / "
                                       "stage3_prefetch_bucket_size";
  h += ", or a smaller train_micro_batch_size_per_gpu";
  if (!gpu && device.is_cuda()) h += " (or fewer processes per host)";
  if (host && util::host_allocator_tuned())
    h += "; DS_MALLOC_TUNING=0 also gives back what malloc keeps of freed host memory (up to " +
         std::to_string(util::tune_host_allocator().trim_threshold >> 20) +
         " MiB per process, kept to spare page faults: src/util/host_allocator.h)";
  return h;
}

}  // namespace

AllocatingFor::AllocatingFor(const char* what, int64_t index, int64_t numel,
                             int64_t element_size) noexcept
    : what_(what), index_(index), numel_(numel), element_size_(element_size),
      exceptions_(std::uncaught_exceptions()) {
  // This thread's record, with no exception in flight in it now nor being handled: that
  // exception was caught and handled without a report (a clean-up's error swallowed, say). Left,
  // it would keep this thread's next failed allocation out of the record (the innermost scope's
  // is kept), and could be the newest when a report comes. Inside a catch block (a clean-up
  // before a rethrow) it may be the caught exception's, still to be reported: it stays, as other
  // threads' do (autograd's device thread hands its error to the caller's).
  if (exceptions_ > 0 || !failed_allocation_kept.load(std::memory_order_relaxed)) return;
  if (std::current_exception()) return;
  std::lock_guard<std::mutex> lock(failed_allocation_mutex);
  failed_allocations.erase(std::this_thread::get_id());
  failed_allocation_kept = !failed_allocations.empty();
}

AllocatingFor::~AllocatingFor() {
  if (std::uncaught_exceptions() <= exceptions_) return;
  try {
    std::string named = what_;
    if (index_ >= 0) named += " " + std::to_string(index_);
    named += " (" + std::to_string(numel_) + " elements, " +
             gib(static_cast<double>(numel_) * element_size_) + ")";
    std::lock_guard<std::mutex> lock(failed_allocation_mutex);
    // Only the innermost scope an exception leaves: it is the one that names the buffer.
    auto [it, made] = failed_allocations.try_emplace(std::this_thread::get_id());
    if (made) {
      it->second = {std::move(named), ++failed_allocations_made};
      failed_allocation_kept = true;
    }
  } catch (...) {  // out of memory for the words too: the report goes without them
  }
}

std::string take_failed_allocation() {
  std::lock_guard<std::mutex> lock(failed_allocation_mutex);
  auto taken = failed_allocations.end();
  if (auto own = failed_allocations.find(std::this_thread::get_id());
      own != failed_allocations.end() && own->second.order > reported_up_to)
    taken = own;
  else
    for (auto it = failed_allocations.begin(); it != failed_allocations.end(); ++it)
      if (it->second.order > reported_up_to &&
          (taken == failed_allocations.end() || it->second.order > taken->second.order))
        taken = it;
  std::string named;
  if (taken != failed_allocations.end()) {
    named = std::move(taken->second.named);
    failed_allocations.erase(taken);
  }
  failed_allocations.erase(std::this_thread::get_id());  // an older one of its own, not reported
  reported_up_to = failed_allocations_made;
  failed_allocation_kept = !failed_allocations.empty();
  return named;
}

void forget_failed_allocation() {
  std::lock_guard<std::mutex> lock(failed_allocation_mutex);
  failed_allocations.erase(std::this_thread::get_id());
  reported_up_to = failed_allocations_made;
  failed_allocation_kept = !failed_allocations.empty();
}

std::optional<std::string> out_of_memory_message(const std::string& libtorch_message,
                                                 const std::string& where, int zero_stage,
                                                 c10::Device device, const std::string& allocating,
                                                 const char* phase_tensors) {
  const bool host = libtorch_message.find("can't allocate memory") != std::string::npos;
  if (!host && libtorch_message.find("out of memory") == std::string::npos) return std::nullopt;
  // CUDA's caching allocator says "CUDA out of memory"; a bare "CUDA error: out of memory" comes
  // from a CUDA call outside it, page-locked host memory (pin_memory) among them.
  const bool gpu = !host && device.is_cuda() &&
                   libtorch_message.find("CUDA out of memory") != std::string::npos;
  const std::string memory = gpu    ? "GPU memory on " + device.str()
                             : host ? std::string("host memory")
                             : device.is_cuda()
                                 ? "GPU or page-locked host memory on " + device.str()
                                 : std::string("memory");
  std::string held;
  if (gpu) {
    const auto mem = device_memory(device);
    held = "; tensors held " + gib(mem.allocated) + ", peak " + gib(mem.allocated_peak) +
           ", of " + gib(mem.total);
  }
  std::string what;
  if (!allocating.empty())
    what = " while allocating " + allocating;
  else if (phase_tensors)
    what = " (in no buffer deepspeed names: most likely the model's " +
           std::string(phase_tensors) + ")";
  return "out of " + memory + " in " + where + what + " (zero stage " + std::to_string(zero_stage) + "): " +
         bytes_asked(libtorch_message) + held + ". Try " + hint(zero_stage, device, gpu, host);
}

}  // namespace deepspeed
