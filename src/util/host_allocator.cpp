#include "util/host_allocator.h"

#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "util/env_flag.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace deepspeed {
namespace util {

namespace {

// glibc reads these at its first malloc; a process started with any of them keeps its choice.
constexpr const char* kGlibcVariables[] = {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                                           "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_"};

bool set(const char* v) { return v != nullptr && *v != 0; }

}  // namespace

HostAllocatorTuning decide_host_allocator_tuning(
    const std::function<const char*(const char*)>& getenv) {
  HostAllocatorTuning t;
  const char* v = getenv("DS_MALLOC_TUNING");
  if (!flag_from_value("DS_MALLOC_TUNING", v, true,
                       "glibc malloc keeps freed memory for reuse: the default",
                       "malloc left as the process started")) {
    t.reason = std::string("DS_MALLOC_TUNING=") + v;
    return t;
  }
#if !defined(__GLIBC__)
  t.reason = "not glibc's malloc";
  return t;
#else
  for (const char* name : kGlibcVariables) {
    if (set(getenv(name))) {
      t.reason = fmt::format("{} is set (the user's malloc settings win)", name);
      return t;
    }
  }
  if (const char* tunables = getenv("GLIBC_TUNABLES");
      set(tunables) && std::strstr(tunables, "glibc.malloc.") != nullptr) {
    t.reason = "GLIBC_TUNABLES sets glibc.malloc (the user's malloc settings win)";
    return t;
  }
  if (const char* preload = getenv("LD_PRELOAD");
      set(preload) && std::strstr(preload, "malloc") != nullptr) {
    t.reason = fmt::format("LD_PRELOAD='{}' brings another allocator", preload);
    return t;
  }
  t.apply = true;
  t.reason = fmt::format("glibc malloc: mmap threshold {} MiB, trim threshold {} MiB",
                         t.mmap_threshold >> 20, t.trim_threshold >> 20);
  return t;
#endif
}

bool apply_host_allocator_tuning(HostAllocatorTuning& t) {
  if (!t.apply) return false;
#if defined(__GLIBC__)
  // mallopt returns 1 on success. Setting either threshold also stops glibc's own adjustment
  // of both, which is why both are set.
  if (mallopt(M_MMAP_THRESHOLD, static_cast<int>(t.mmap_threshold)) == 1 &&
      mallopt(M_TRIM_THRESHOLD, static_cast<int>(t.trim_threshold)) == 1)
    return true;
  t.reason = "glibc refused " + t.reason;
#endif
  t.apply = false;
  return false;
}

namespace {
std::atomic<bool> tuned{false};
}  // namespace

const HostAllocatorTuning& tune_host_allocator() {
  static std::once_flag once;
  static HostAllocatorTuning outcome;
  std::call_once(once, [] {
    outcome = decide_host_allocator_tuning([](const char* name) { return std::getenv(name); });
    tuned = apply_host_allocator_tuning(outcome);
  });
  return outcome;
}

bool host_allocator_tuned() { return tuned; }

}  // namespace util
}  // namespace deepspeed
