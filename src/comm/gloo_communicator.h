// The Gloo-backed Communicator (private). Public entry points are make_gloo_communicator() and
// init_from_process_info() in deepspeed/comm.h.
#pragma once
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <memory>
#include <string>

#include "deepspeed/comm.h"

namespace gloo {
namespace transport {
class Device;
}
}  // namespace gloo

namespace deepspeed {
namespace comm {

class FailureBoard;

// The Gloo transport device for a job whose store lives at `master_addr`: GLOO_SOCKET_IFNAME if
// set (as torch.distributed does), the loopback device for 127.x/localhost jobs, else the device
// on the local address that routes to master_addr (local_address_towards in process_info.h).
std::shared_ptr<::gloo::transport::Device> gloo_device_for(const std::string& master_addr);

// Joins a Gloo group over `store` (COLLECTIVE: all world_size ranks must call it). Throws
// CommError naming the rank when the rendezvous fails or times out. `host`: which host this rank
// counts as on (gloo_group_plan.h); empty: shm_host_identity(). Tests give ranks that share a
// process identities of their own, to run the multi-host paths on one machine.
CommunicatorPtr make_gloo_communicator_on(c10::intrusive_ptr<c10d::Store> store, int rank,
                                          int world_size, int local_rank,
                                          std::chrono::milliseconds timeout,
                                          std::shared_ptr<::gloo::transport::Device> device,
                                          std::string host = "");

// The rendezvous store of a Gloo communicator (what its sub-groups and the desync checker build
// on), or null for any other communicator.
c10::intrusive_ptr<c10d::Store> store_of(const Communicator& comm);

// A sub-group: numbered on the root's failure board under channel `channel`.
CommunicatorPtr make_gloo_communicator_on(c10::intrusive_ptr<c10d::Store> store, int rank,
                                          int world_size, int local_rank,
                                          std::chrono::milliseconds timeout,
                                          std::shared_ptr<::gloo::transport::Device> device,
                                          std::shared_ptr<FailureBoard> board,
                                          std::string channel, std::string host = "");

// The failure board (failure_board.h) that `comm`'s operations are numbered on, seen through the
// desync checker; null for communicators without one (world size 1, NCCL, test doubles).
std::shared_ptr<FailureBoard> failure_board_of(const Communicator& comm);

// Why `comm`'s next collective would never complete (FailureBoard::why_stuck), or "" (also
// without a board). For waits that come before the collective: the desync checker's.
std::string why_next_collective_is_stuck(const Communicator& comm);

// The largest all-reduce (bytes) that `comm` does through shared memory (shm_allreduce.h): 0
// when it has no shared-memory path (not a Gloo communicator, ranks on several hosts, or
// DS_SHM_ALLREDUCE=0). For tests and benchmarks.
size_t shm_allreduce_limit(const Communicator& comm);
// The same for all-gathers (bytes gathered, world x chunk): 0 without a shared-memory path.
size_t shm_allgather_limit(const Communicator& comm);

// Whether `comm` moves host tensors' reduce-scatters, all-gathers and all-to-alls as
// point-to-point messages with the receives posted first (gloo_exchange.h): false when it is not
// a Gloo communicator. For tests and benchmarks.
bool gloo_exchanges_host_tensors(const Communicator& comm);

// Whether `comm` runs host tensors' reduce-scatters and all-gathers within and then across hosts
// (gloo_hierarchy.h): false when it is not a Gloo communicator. For tests and benchmarks.
bool gloo_hierarchical(const Communicator& comm);

}  // namespace comm
}  // namespace deepspeed
