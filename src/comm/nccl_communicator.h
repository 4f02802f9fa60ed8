// The NCCL-backed Communicator (c10d ProcessGroupNCCL), for ranks that each own a GPU. Compiled
// in when libtorch has CUDA (USE_C10D_NCCL); on other builds make_nccl_communicator_on throws.
//
// Tensors on the rank's GPU go to NCCL as they are (bf16 included, no conversion). Host tensors
// (the engine's loss scalar, votes, the sub-group exchange) are staged through the GPU so every
// collective of the interface works with either. Collectives are asynchronous on the device:
// Work::wait() makes the caller's current CUDA stream wait for NCCL's stream (no host sync),
// except for host tensors, whose result is copied back on wait(), and while the comms_logger
// times collectives (keep_latencies() or its verbose observer): then the host waits for the
// current stream before the launch and for the collective in wait(), as DeepSpeed's timed_op
// synchronizes, so that the latency recorded is the collective's.
#pragma once
#include <c10/util/intrusive_ptr.h>

#include <chrono>

#include "deepspeed/comm.h"

namespace deepspeed {
namespace comm {

// Whether this build can create NCCL communicators (libtorch with CUDA and c10d NCCL).
bool nccl_built();

// Joins an NCCL group over `store` on GPU `device_index` (COLLECTIVE: all world_size ranks).
// Throws CommError naming the rank when the build has no NCCL or the setup fails.
CommunicatorPtr make_nccl_communicator_on(c10::intrusive_ptr<c10d::Store> store, int rank,
                                          int world_size, int local_rank, int device_index,
                                          std::chrono::milliseconds timeout);

}  // namespace comm
}  // namespace deepspeed
