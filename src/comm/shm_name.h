// The names of the shared-memory segments behind the local all-reduce (shm_segment.cpp), in one
// place for the two programs that need them: the ranks (rank 0 creates
// "/ds_shm_<pid>_<n>_<random>" and unlinks it once every local rank has attached) and dsrun, which removes what a rank killed
// during that setup left in /dev/shm. Plain C++: dsrun does not link libtorch.
#pragma once
#include <string>

namespace deepspeed {
namespace comm {

// Every segment rank 0 (process `pid`) creates starts with this, in shm_open's namespace.
inline std::string shm_segment_prefix(long pid) { return "/ds_shm_" + std::to_string(pid) + "_"; }

// The stem of the `n`-th segment process `pid` creates (shm_segment.cpp appends "_<random>").
inline std::string shm_segment_name(long pid, int n) {
  return shm_segment_prefix(pid) + std::to_string(n);
}

}  // namespace comm
}  // namespace deepspeed
