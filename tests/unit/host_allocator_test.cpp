// The host allocator's settings (util/host_allocator.h): when they are applied, what they do to
// glibc's malloc, and that an entry point applies them.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "comm/launch_world.h"
#include "deepspeed/errors.h"
#include "support/forked_child.h"
#include "util/host_allocator.h"

#if defined(__GLIBC__)
#include <malloc.h>
#if __GLIBC_PREREQ(2, 33)
#define DS_TEST_MALLINFO2 1  // mallinfo2: glibc 2.33 and later
#endif
#endif

namespace host_allocator_test {

namespace util = deepspeed::util;

namespace {

util::HostAllocatorTuning decide(const std::map<std::string, std::string>& env) {
  return util::decide_host_allocator_tuning([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

#if defined(DS_TEST_MALLINFO2)
constexpr size_t kBlock = size_t{16} << 20;  // above glibc's initial mmap threshold, below 32 MiB
constexpr int kGlibcInitialThreshold = 128 * 1024;

// glibc's settings as a process starts (mmap and trim thresholds 128 KiB), fixed: setting them
// also stops glibc from raising them as mapped blocks are freed.
void start_from_glibc_defaults() {
  mallopt(M_MMAP_THRESHOLD, kGlibcInitialThreshold);
  mallopt(M_TRIM_THRESHOLD, kGlibcInitialThreshold);
}

// Whether a fresh kBlock allocation was mapped (mmap) rather than cut from the heap; with
// `then_kept`, whether the heap still holds it after free (not trimmed back to the OS).
struct BlockFate {
  bool mapped = false, kept = false;
};
BlockFate allocate_and_free_block() {
  BlockFate fate;
  const size_t mapped_before = mallinfo2().hblkhd;
  char* p = static_cast<char*>(std::malloc(kBlock));
  std::memset(p, 1, kBlock);  // resident, as a tensor written by a step
  asm volatile("" : : "r"(p) : "memory");  // the compiler may not drop the malloc/free pair
  fate.mapped = mallinfo2().hblkhd >= mapped_before + kBlock;
  const size_t heap_before_free = mallinfo2().arena;
  std::free(p);
  fate.kept = !fate.mapped && mallinfo2().arena >= heap_before_free;
  return fate;
}
#endif

}  // namespace

TEST(HostAllocator, AppliesByDefaultOnGlibc) {
  auto t = decide({});
#if defined(__GLIBC__)
  EXPECT_TRUE(t.apply) << t.reason;
  EXPECT_EQ(t.mmap_threshold, size_t{32} << 20);
  EXPECT_EQ(t.trim_threshold, size_t{1} << 30);
  EXPECT_NE(t.reason.find("mmap threshold 32 MiB"), std::string::npos) << t.reason;
#else
  EXPECT_FALSE(t.apply);
#endif
  EXPECT_EQ(decide({{"DS_MALLOC_TUNING", "1"}}).apply, t.apply);
  EXPECT_EQ(decide({{"DS_MALLOC_TUNING", "true"}}).apply, t.apply);
  EXPECT_EQ(decide({{"DS_MALLOC_TUNING", ""}}).apply, t.apply);   // set but empty: unset
  EXPECT_EQ(decide({{"MALLOC_TOP_PAD_", ""}}).apply, t.apply);
  EXPECT_EQ(decide({{"GLIBC_TUNABLES", "glibc.cpu.hwcaps=-AVX2"}}).apply, t.apply);
  EXPECT_EQ(decide({{"LD_PRELOAD", "/usr/lib/libasan.so"}}).apply, t.apply);
}

TEST(HostAllocator, LeavesMallocAloneWhenTheUserChose) {
  const std::map<std::string, std::string> cases[] = {
      {{"DS_MALLOC_TUNING", "0"}},
      {{"DS_MALLOC_TUNING", "false"}},
      {{"MALLOC_MMAP_THRESHOLD_", "65536"}},
      {{"MALLOC_TRIM_THRESHOLD_", "1"}},
      {{"MALLOC_TOP_PAD_", "0"}},
      {{"MALLOC_MMAP_MAX_", "0"}},
      {{"GLIBC_TUNABLES", "glibc.malloc.trim_threshold=4096"}},
      {{"LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}},
  };
  for (const auto& env : cases) {
    const auto& [name, value] = *env.begin();
    auto t = decide(env);
    EXPECT_FALSE(t.apply) << name << "=" << value;
    EXPECT_NE(t.reason.find(name == "DS_MALLOC_TUNING" ? name + "=" + value : name),
              std::string::npos)
        << t.reason;
    util::HostAllocatorTuning copy = t;
    EXPECT_FALSE(util::apply_host_allocator_tuning(copy));  // nothing to apply
  }
}

TEST(HostAllocator, BadSwitchValueIsNamed) {
  try {
    decide({{"DS_MALLOC_TUNING", "yes"}});
    FAIL() << "accepted DS_MALLOC_TUNING=yes";
  } catch (const deepspeed::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("DS_MALLOC_TUNING='yes'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("1/true"), std::string::npos) << e.what();
  }
}

#if defined(DS_TEST_MALLINFO2)
// In a child (the settings are process-wide): a 16 MiB block is mapped and given back under
// glibc's own settings, and cut from the heap and kept there after apply.
TEST(HostAllocator, AppliedSettingsKeepFreedBlocksInTheHeap) {
  const int status = dstest::run_in_child([] {
    start_from_glibc_defaults();
    const BlockFate plain = allocate_and_free_block();
    if (!plain.mapped) {
      std::fprintf(stderr, "under glibc's settings a 16 MiB block was not mapped\n");
      return 2;
    }
    auto t = decide({});
    if (!util::apply_host_allocator_tuning(t)) {
      std::fprintf(stderr, "not applied: %s\n", t.reason.c_str());
      return 3;
    }
    const BlockFate tuned = allocate_and_free_block();
    if (tuned.mapped || !tuned.kept) {
      std::fprintf(stderr, "after apply: mapped %d, kept %d\n", tuned.mapped, tuned.kept);
      return 4;
    }
    return 0;
  });
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// An entry point (world_or_launch: initialize, initialize_pipeline, zero::Init, init_inference)
// tunes the process. Run in a fresh process (this program again, this case only) so that nothing
// before it has tuned malloc already: HostAllocatorFresh below, which skips unless started so.
TEST(HostAllocator, EntryPointTunesTheProcess) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("DS_HOST_ALLOCATOR_FRESH", "1", 1);
    for (const char* v : {"DS_MALLOC_TUNING", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                          "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_", "GLIBC_TUNABLES", "LD_PRELOAD"})
      ::unsetenv(v);
    const char* argv[] = {"unit_tests", "--gtest_filter=HostAllocatorFresh.*", nullptr};
    ::execv("/proc/self/exe", const_cast<char* const*>(argv));
    _exit(127);
  }
  int status = -1;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "HostAllocatorFresh.WorldOrLaunchTunes failed (output above)";
}

TEST(HostAllocatorFresh, WorldOrLaunchTunes) {
  if (std::getenv("DS_HOST_ALLOCATOR_FRESH") == nullptr)
    GTEST_SKIP() << "runs in a fresh process started by HostAllocator.EntryPointTunesTheProcess";
  start_from_glibc_defaults();
  ASSERT_TRUE(allocate_and_free_block().mapped) << "glibc's own settings map a 16 MiB block";
  auto comm = deepspeed::comm::world_or_launch("host_allocator_test",
                                               deepspeed::comm::make_single_process_communicator());
  ASSERT_NE(comm, nullptr);
  const BlockFate after = allocate_and_free_block();
  EXPECT_FALSE(after.mapped) << "world_or_launch left glibc's settings as they were";
  EXPECT_TRUE(after.kept);
  EXPECT_TRUE(util::tune_host_allocator().apply) << util::tune_host_allocator().reason;
}
#endif

}  // namespace host_allocator_test
