// zero::Init's slices, turned back into parameters one unit at a time at initialize().
#pragma once
#include "deepspeed/comm.h"
#include "deepspeed/zero_unit.h"
#include "zero/stage3/unit_internals.h"

namespace deepspeed {
namespace zero {

// If the unit was partitioned by zero::Init: all-gathers its slices on `device` (the engine's:
// zero::Init keeps them in host memory) and gives its parameters their full values there again
// (cast to each parameter's current dtype), then forgets the shard. COLLECTIVE (every rank calls
// it for the same units in the same order). Throws ConfigError if the Init ran over a different
// world size.
void restore_init_shard(ZeroUnitBase& unit, comm::Communicator& comm, c10::Device device);

}  // namespace zero
}  // namespace deepspeed
