#include "comm/shm_segment.h"
#include "comm/store_bytes.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <random>
#include <vector>

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "util/env_flag.h"
#include "comm/shm_name.h"
#include "deepspeed/errors.h"

namespace deepspeed {
namespace comm {
namespace {

constexpr uint64_t kMagic = 0x64735f73686d3032ull;  // "ds_shm02"
// Any size: on an idle machine ZeRO-0/1/2 steps were 16-64% shorter at 2 ranks and 3.1-3.6x at
// 4 with every all-reduce and reduce-scatter through shared memory (bench/zero_memory_and_speed.py,
// docs/benchmarks.md "Shared-memory all-reduce of any size by default"); the earlier 1 MiB came
// from runs under load where the difference drowned.
constexpr size_t kDefaultMaxBytes = size_t{1} << 40;
// The largest all-gather (bytes of the gathered whole) through shared memory: chosen with
// bench/shm_allreduce.cpp --op all_gather (docs/benchmarks.md, "Shared-memory all-gather").
constexpr size_t kDefaultMaxGatherBytes = size_t{1} << 40;  // any size: faster at every size
// One piece: large enough that the per-piece handshake (a few us) is small against copying it
// (~100 us), small enough that the segment (4 slots x world x this) stays a few MiB.
constexpr size_t kDefaultSlotBytes = 1 << 20;
// Pieces from this size on are reduced in shares (an extra handshake, less reading per rank).
constexpr size_t kDefaultShareBytes = 256 << 10;

// A byte count from environment variable `name` in [lo, hi], or `fallback` when unset.
size_t bytes_from_env(const char* name, size_t fallback, long long lo, long long hi,
                      const char* what) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == 0) return fallback;
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(v, &end, 10);
  if (errno != 0 || *end != 0 || n < lo || n > hi)
    throw ConfigError(fmt::format("environment variable {}='{}' must be {} in [{}, {}]", name, v,
                                  what, lo, hi));
  return static_cast<size_t>(n);
}

std::string first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string link_target(const char* path) {
  char buf[256] = {0};
  ssize_t n = ::readlink(path, buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("?");
}

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

size_t segment_bytes(int world, int slots, size_t slot_bytes) {
  return sizeof(ShmHeader) + sizeof(ShmRankState) * static_cast<size_t>(world) +
         static_cast<size_t>(slots) * static_cast<size_t>(world) * slot_bytes;
}

void* map_fd(int fd, size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : p;
}

// Reserves every page of the segment now. tmpfs sizes a file sparsely: ftruncate succeeds
// whatever room /dev/shm has, and a page that cannot be had when first touched (a copy into a
// slot, mid all-reduce) kills the process with SIGBUS and no message. Returns 0 or the error
// number (posix_fallocate returns it; it does not set errno).
int reserve(int fd, size_t bytes) {
  int err;
  do {
    err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  } while (err == EINTR);  // tmpfs gives up a long reservation when a signal arrives
  return err;
}

// 64 random bits in hex, for a segment's name.
std::string random_token() {
  uint64_t bits = 0;
  try {
    std::random_device rd;
    bits = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  } catch (...) {  // no entropy source: the clock, which the retries below still tell apart
  }
  bits ^= static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return fmt::format("{:016x}", bits);
}

// One line on stderr: the group keeps to Gloo because its segment could not be made.
void say_off(int world, const std::string& why) {
  std::fprintf(stderr,
               "[deepspeed] shared-memory all-reduce off for this group of %d ranks (its "
               "all-reduces go through Gloo): %s\n",
               world, why.c_str());
}

// Rank 0: a fresh segment named "<stem>_<random>" (`name` set to it) with its header and
// counters initialised, or null, said on stderr (not fatal: the group then keeps to Gloo, the
// others learn it from the empty name setup_shm_segment publishes).
std::unique_ptr<ShmSegment> create(const std::string& stem, int world, int slots,
                                   size_t slot_bytes, std::string& name) {
  const size_t bytes = segment_bytes(world, slots, slot_bytes);
  const int fd = create_exclusive_segment(stem, world, name, random_token);
  if (fd < 0) return nullptr;
  void* base = nullptr;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    say_off(world, fmt::format("could not size the segment /dev/shm{} to {} bytes (ftruncate: {})",
                               name, bytes, std::strerror(err)));
  } else if (const int err = reserve(fd, bytes); err != 0) {
    say_off(world, fmt::format(
                       "could not reserve the {}-byte segment /dev/shm{} (posix_fallocate: {}); "
                       "give /dev/shm more room (docker run --shm-size) or lower "
                       "DS_SHM_ALLREDUCE_SLOT_BYTES (the segment is {} slots x ranks x that)",
                       bytes, name, std::strerror(err), slots));
  } else if ((base = map_fd(fd, bytes)) == nullptr) {
    const int err = errno;
    say_off(world, fmt::format("could not map the {}-byte segment /dev/shm{} (mmap: {})", bytes,
                               name, std::strerror(err)));
  }
  ::close(fd);
  if (base == nullptr) {
    ::shm_unlink(name.c_str());
    return nullptr;
  }
  auto seg = std::make_unique<ShmSegment>(base, bytes);
  for (int r = 0; r < world; ++r) {
    ShmRankState* s = new (&seg->rank_state(r)) ShmRankState();
    s->arrived.store(0);
    s->reduced.store(0);
    s->done.store(0);
    s->pid.store(0);
    s->closed.store(0);
    s->futex.store(0);
    s->waiters.store(0);
  }
  ShmHeader& h = seg->header();
  h.world = world;
  h.slots = slots;
  h.slot_bytes = slot_bytes;
  std::atomic_thread_fence(std::memory_order_release);
  h.magic = kMagic;  // last: the others check it (the store round trip orders it anyway)
  return seg;
}

std::unique_ptr<ShmSegment> attach(const std::string& name, int world, int slots,
                                   size_t slot_bytes) {
  const size_t bytes = segment_bytes(world, slots, slot_bytes);
  int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) return nullptr;
  struct stat st {};
  void* base = ::fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) == bytes
                   ? map_fd(fd, bytes)
                   : nullptr;
  ::close(fd);
  if (base == nullptr) return nullptr;
  auto seg = std::make_unique<ShmSegment>(base, bytes);
  const ShmHeader& h = seg->header();
  if (h.magic != kMagic || h.world != world || h.slots != slots || h.slot_bytes != slot_bytes)
    return nullptr;
  return seg;
}

}  // namespace

// Tries other names while one exists: a crashed job's leftover (containers that share /dev/shm
// reuse low pids, and the pid and count alone repeat) must not keep this group off shared memory.
int create_exclusive_segment(const std::string& stem, int world, std::string& name,
                             const std::function<std::string()>& next_token) {
  constexpr int kTries = 8;
  for (int i = 0; i < kTries; ++i) {
    name = stem + "_" + next_token();
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0) return fd;
    const int err = errno;
    if (err != EEXIST || i + 1 == kTries) {
      say_off(world, fmt::format("could not create the segment /dev/shm{} (shm_open: {}{})",
                                 name, std::strerror(err),
                                 err == EEXIST ? fmt::format(", {} names tried", kTries) : ""));
      return -1;
    }
  }
  return -1;
}

ShmSegment::~ShmSegment() { ::munmap(base_, bytes_); }

char* ShmSegment::slot(uint64_t seq, int r) const {
  const ShmHeader& h = header();
  const size_t index = static_cast<size_t>(seq % static_cast<uint64_t>(h.slots)) *
                           static_cast<size_t>(h.world) +
                       static_cast<size_t>(r);
  return static_cast<char*>(base_) + sizeof(ShmHeader) +
         sizeof(ShmRankState) * static_cast<size_t>(h.world) + index * h.slot_bytes;
}

std::string shm_host_identity() {
  char name[256] = {0};
  ::gethostname(name, sizeof name - 1);
  struct stat st {};
  const std::string shm_dev =
      ::stat("/dev/shm", &st) == 0 ? fmt::format("{}:{}", st.st_dev, st.st_ino) : "none";
  return fmt::format("{} {} {} {} {} {}", name, first_line("/proc/sys/kernel/random/boot_id"),
                     link_target("/proc/self/ns/net"), link_target("/proc/self/ns/pid"),
                     link_target("/proc/self/ns/ipc"), shm_dev);
}

bool shm_allreduce_enabled_from_env() {
  return util::flag_from_env("DS_SHM_ALLREDUCE", true,
                             "shared-memory all-reduce for groups on one host, the default",
                             "always Gloo");
}

size_t shm_allreduce_max_bytes_from_env() {
  return bytes_from_env("DS_SHM_ALLREDUCE_MAX_BYTES", kDefaultMaxBytes, 1, 1ll << 40,
                        "the largest all-reduce (bytes) through shared memory");
}

size_t shm_allgather_max_bytes_from_env() {
  return bytes_from_env("DS_SHM_ALLGATHER_MAX_BYTES", kDefaultMaxGatherBytes, 1, 1ll << 40,
                        "the largest all-gather or all-to-all (bytes) through shared memory");
}

size_t shm_allreduce_slot_bytes_from_env() {
  return bytes_from_env("DS_SHM_ALLREDUCE_SLOT_BYTES", kDefaultSlotBytes, 64, 1ll << 30,
                        "the shared-memory piece size (bytes)");
}

size_t shm_allreduce_share_bytes_from_env() {
  return bytes_from_env("DS_SHM_ALLREDUCE_SHARE_BYTES", kDefaultShareBytes, 1, 1ll << 40,
                        "the smallest piece (bytes) reduced in shares");
}

std::unique_ptr<ShmSegment> setup_shm_segment(c10d::Store& store, int rank, int world, int slots,
                                              size_t slot_bytes, const std::string& settings,
                                              const std::string& host) {
  slot_bytes = round_up(slot_bytes, 64);
  // 1. Does every rank want it, with the same sizes, and is every rank here?
  const bool enabled = shm_allreduce_enabled_from_env();
  const std::string me = (enabled ? "1 " : "0 ") + host + " " + settings;
  store.set(fmt::format("ds_shm/host/{}", rank), store_bytes(me));
  bool local = enabled;
  for (int r = 0; r < world && local; ++r)
    local = r == rank || store_string(store.get(fmt::format("ds_shm/host/{}", r))) == me;
  // Every rank reads the same keys, so all reach the same answer; a rank that stops reading
  // early (not local) also stops here, before any key below is needed.
  if (!local) return nullptr;

  // 2. Rank 0 creates, the others attach and report, rank 0 unlinks.
  std::unique_ptr<ShmSegment> seg;
  if (rank == 0) {
    static std::atomic<int> count{0};
    std::string name;
    seg = create(shm_segment_name(::getpid(), count++), world, slots, slot_bytes, name);
    if (seg) seg->rank_state(0).pid.store(static_cast<int32_t>(::getpid()));
    store.set("ds_shm/name", store_bytes(seg ? name : std::string()));
    bool all = seg != nullptr;
    try {
      for (int r = 1; r < world; ++r)
        all = store_string(store.get(fmt::format("ds_shm/attached/{}", r))) == "1" && all;
    } catch (...) {
      if (seg) ::shm_unlink(name.c_str());
      throw;
    }
    if (seg) ::shm_unlink(name.c_str());
    store.set("ds_shm/ready", store_bytes(all ? "1" : "0"));
    if (!all) seg.reset();
  } else {
    const std::string name = store_string(store.get("ds_shm/name"));
    if (!name.empty()) seg = attach(name, world, slots, slot_bytes);
    if (seg) seg->rank_state(rank).pid.store(static_cast<int32_t>(::getpid()));
    store.set(fmt::format("ds_shm/attached/{}", rank), store_bytes(seg ? "1" : "0"));
    if (store_string(store.get("ds_shm/ready")) != "1") seg.reset();
  }
  return seg;
}

}  // namespace comm
}  // namespace deepspeed
