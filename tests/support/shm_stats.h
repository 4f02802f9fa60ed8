// The shared-memory collectives (src/comm/shm_allreduce.h) must count in a communicator's
// statistics exactly as the Gloo path does: helpers for the shm tests that check it.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "deepspeed/comm.h"

namespace dstest {

// Rank 0's statistics after `body` ran on 2 ranks (statistics reset first): with the
// shared-memory path off (DS_SHM_ALLREDUCE=0, first) and on.
struct StatsBothWays {
  deepspeed::comm::CommStats gloo, shm;
};
StatsBothWays stats_without_and_with_shm(
    const std::function<void(deepspeed::comm::CommunicatorPtr)>& body);

// `op` is the only operation counted, `calls` times, with the same calls, bytes and calls per
// size on both paths (gtest expectations).
void expect_counted_alike(const StatsBothWays& stats, const std::string& op, int64_t calls);

}  // namespace dstest
