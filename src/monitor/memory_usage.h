// DeepSpeed's see_memory_usage, with the model states this rank holds: the lines an engine
// prints after its first optimizer step and on Engine::see_memory_usage().
//   <message>
//   MA 1.23 GB         Max_MA 1.5 GB         Max_CA 2.0 GB          (GPU devices only)
//   CPU Virtual Memory:  used = 12.34 GB, percent = 45.6%
//   model states (MB): parameters 1.23 | gradients 1.23 | optimizer states 2.46 | comm buffers 0.5
//   | total 5.42 process RSS (MB): now 512.3 | peak (VmHWM) 600.1
#pragma once
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

#include "deepspeed/memory.h"

namespace deepspeed {
namespace monitor {

// This process and the machine, from /proc (Linux); zeros where it cannot be read.
struct HostMemory {
  int64_t rss = 0;        // VmRSS
  int64_t peak_rss = 0;   // VmHWM: the resident high-water mark since the process started
  int64_t total = 0;      // MemTotal
  int64_t available = 0;  // MemAvailable
};
HostMemory host_memory();

std::vector<std::string> memory_usage_lines(const std::string& message, const MemoryReport& states,
                                            c10::Device device);

}  // namespace monitor
}  // namespace deepspeed
