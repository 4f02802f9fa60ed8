// zero::Init's slices, turned back into parameters one unit at a time at initialize().
#pragma once
#include "deepspeed/comm.h"
#include "deepspeed/zero_unit.h"
#include "zero/stage3/unit_internals.h"

namespace deepspeed {
namespace zero {

// Elements per rank are a multiple of this (64 bytes of fp32): the same alignment the stage-3
// partitions use.
constexpr int64_t kStage3Alignment = 16;

// If the unit was partitioned by zero::Init: all-gathers its slices and gives its parameters
// their full values again (cast to each parameter's current dtype), then forgets the shard.
// COLLECTIVE (every rank calls it for the same units in the same order). Throws ConfigError if
// the Init ran over a different world size.
void restore_init_shard(ZeroUnitBase& unit, comm::Communicator& comm);

}  // namespace zero
}  // namespace deepspeed
