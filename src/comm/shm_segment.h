// The shared-memory segment of one group whose ranks all live on this host (shm_allreduce.h uses
// it): what "on this host" means, and how the segment is created, attached and unlinked through
// the group's rendezvous store so that nothing is left in /dev/shm.
//
// Layout (every part 64-byte aligned, so no two ranks' counters share a cache line):
//   ShmHeader | ShmRankState[world] | data: slots x world x slot_bytes
// The data slot of (piece seq, rank r) is slot (seq % slots), row r. A piece is at most
// slot_bytes of one all-reduce (shm_allreduce.h splits larger ones).
#pragma once
#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace c10d {
class Store;
}

namespace deepspeed {
namespace comm {

struct alignas(64) ShmHeader {
  uint64_t magic;
  int32_t world;
  int32_t slots;
  uint64_t slot_bytes;
};

// One rank's progress: written only by that rank, except `waiters` (its sleeping peers).
struct alignas(64) ShmRankState {
  std::atomic<uint64_t> arrived;  // seq of the last piece whose data this rank published
  std::atomic<uint64_t> reduced;  // seq of the last piece whose share this rank reduced (shares)
  std::atomic<uint64_t> done;     // seq of the last piece this rank finished reading
  std::atomic<int32_t> pid;       // for the liveness check of a rank that stopped moving
  std::atomic<int32_t> closed;    // 1: the rank's communicator is gone or failed
  // Bumped after every change of arrived or done; a peer that stops spinning sleeps on it (a
  // futex on the shared mapping), counted in `waiters` so that publishing wakes only when needed.
  std::atomic<uint32_t> futex;
  std::atomic<int32_t> waiters;
};

// A mapped segment (unmapped on destruction; its name is already unlinked).
class ShmSegment {
 public:
  ShmSegment(void* base, size_t bytes) : base_(base), bytes_(bytes) {}
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  ShmHeader& header() const { return *static_cast<ShmHeader*>(base_); }
  ShmRankState& rank_state(int r) const {
    return reinterpret_cast<ShmRankState*>(static_cast<char*>(base_) + sizeof(ShmHeader))[r];
  }
  char* slot(uint64_t seq, int r) const;

 private:
  void* base_;
  size_t bytes_;
};

// This process's host identity for deciding whether a group can share memory: hostname, boot
// id, and the network, pid and ipc namespaces and the /dev/shm mount it sees. Ranks in separate
// network namespaces (tests/launcher/multinode_*.sh simulates hosts that way) count as separate
// hosts, so those tests keep testing the network.
std::string shm_host_identity();

// Whether DS_SHM_ALLREDUCE allows the shared-memory path: unset, "1" or "true" yes; "0" or
// "false" no; anything else ConfigError naming the variable.
bool shm_allreduce_enabled_from_env();

// The largest all-reduce (bytes) the shared-memory path takes, in pieces of at most the slot size:
// DS_SHM_ALLREDUCE_MAX_BYTES, or the default chosen with bench/shm_allreduce.cpp and
// bench/zero_memory_and_speed.py (docs/benchmarks.md). ConfigError for a value that is not an
// integer in [1, 2^40].
size_t shm_allreduce_max_bytes_from_env();

// The largest all-gather (bytes of the gathered whole, world x chunk) or all-to-all (bytes of the
// input) the shared-memory path takes, in pieces of at most the slot size: DS_SHM_ALLGATHER_MAX_BYTES, or the default chosen
// with bench/shm_allreduce.cpp --op all_gather. ConfigError outside [1, 2^40].
size_t shm_allgather_max_bytes_from_env();

// The size of one piece (one slot row, bytes): DS_SHM_ALLREDUCE_SLOT_BYTES, default 1 MiB. The
// segment holds slots x world x this. ConfigError for a value outside [64, 2^30].
size_t shm_allreduce_slot_bytes_from_env();

// Pieces of at least this many bytes are reduced in shares, each rank its 1/world of every row
// (shm_allreduce.h): DS_SHM_ALLREDUCE_SHARE_BYTES, default chosen with bench/shm_allreduce.cpp.
// ConfigError for a value outside [1, 2^40] (a value above the slot size: never).
size_t shm_allreduce_share_bytes_from_env();

// Creates (O_EXCL, mode 0600) and opens a new segment "<stem>_<next_token()>", drawing another
// token while the name exists, at most 8 times. Returns the descriptor and sets `name` to the
// segment's; or -1 (`name`: the last tried) after saying on stderr why this group of `world`
// ranks keeps to Gloo. setup_shm_segment draws 64 random bits; tests draw their own.
int create_exclusive_segment(const std::string& stem, int world, std::string& name,
                             const std::function<std::string()>& next_token);

// Sets up the segment of a group over its rendezvous store. COLLECTIVE over the group (after the
// Gloo group is made): every rank publishes whether it wants the shared-memory path and its host
// identity (with `settings`, the sizes that every rank must agree on); when all want it and all
// identities match, rank 0 creates /dev/shm/ds_shm_<pid>_<n>_<random> (O_EXCL; its pid and a
// process-wide count keep its own names apart, the 64 random bits a crashed job's leftover of the
// same pid, e.g. in another container sharing /dev/shm; a name that exists is retried with other
// bits, and a segment that cannot be made is said on stderr, naming it), the others attach,
// and rank 0 unlinks the name as soon as every rank has reported back, so a crash afterwards
// leaves nothing behind. Returns null on every rank alike when the group is not local, any rank
// disabled the path, /dev/shm has no room for the segment (rank 0 reserves every page up front
// and says so on stderr), or any rank failed to attach. Store waits are bounded by the store's
// timeout; a rank that never reports makes this throw (the name is unlinked first).
// `host`: this rank's shm_host_identity() (or the identity a test gives its ranks).
std::unique_ptr<ShmSegment> setup_shm_segment(c10d::Store& store, int rank, int world, int slots,
                                              size_t slot_bytes, const std::string& settings,
                                              const std::string& host);

}  // namespace comm
}  // namespace deepspeed
