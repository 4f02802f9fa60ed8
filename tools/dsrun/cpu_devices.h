// How many ranks dsrun starts by default on a machine without GPUs: DeepSpeed's CPU
// accelerator's device_count(), which its launcher starts one rank per (its pool is
// {localhost: device count}). Pure functions of their arguments (the environment value and the
// sysfs root are passed in), unit-tested in tests/unit/dsrun_cpu_devices_test.cpp.
#pragma once
#include <string>

namespace deepspeed {
namespace launcher {

// The NUMA nodes under <sysfs_root>/devices/system/node (directories nodeN, in N order) that
// DeepSpeed counts as CPU devices: a node whose cpulist is empty (HBM in flat mode: memory, no
// cores) is left out, and a node with the same CPUs as the last node counted (fake NUMA
// splitting one node's memory) counts once with it. 0 when nothing can be read there.
int numa_node_count(const std::string& sysfs_root);

// DeepSpeed's CPU device_count(): `local_size` (the LOCAL_SIZE variable; null or "" when unset)
// when it is a positive integer, else numa_node_count(sysfs_root), at least 1. Throws
// LaunchError naming LOCAL_SIZE and its value when it is set but not an integer (DeepSpeed's
// int() fails there too).
int cpu_device_count(const char* local_size, const std::string& sysfs_root = "/sys");

}  // namespace launcher
}  // namespace deepspeed
