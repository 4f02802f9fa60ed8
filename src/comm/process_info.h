// Environment parsing for init_distributed (private; detect_process_info is public in comm.h).
#pragma once
#include <chrono>

#include "deepspeed/comm.h"

namespace deepspeed {
namespace comm {

// The collective timeout init_distributed uses. As in DeepSpeed, env DEEPSPEED_TIMEOUT (whole
// minutes) replaces the default of 30 minutes; a timeout the caller set to anything else wins.
// Throws ConfigError naming DEEPSPEED_TIMEOUT when it is not a positive integer.
std::chrono::milliseconds resolve_timeout(const InitOptions& options);

// Ranks on this node, from the first launcher variable present: LOCAL_WORLD_SIZE (dsrun,
// torchrun), LOCAL_SIZE (DeepSpeed's launch.py), OMPI_COMM_WORLD_LOCAL_SIZE (mpirun),
// SLURM_NTASKS_PER_NODE (srun); `fallback` when none is. Throws ConfigError naming a variable that
// is not an integer.
int local_world_size(int fallback);

// The address of this host's interface that routes to `master_addr` (resolved with getaddrinfo):
// what the other ranks can reach this one at, found without sending a packet (a UDP socket is
// connected and asked for its local address). Throws CommError naming master_addr when it cannot
// be resolved or no route leads to it.
std::string local_address_towards(const std::string& master_addr);

}  // namespace comm
}  // namespace deepspeed
