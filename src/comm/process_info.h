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

}  // namespace comm
}  // namespace deepspeed
