// Argument checks shared by every all_to_all implementation (deepspeed/comm.h).
#pragma once
#include <ATen/Tensor.h>

#include "deepspeed/comm.h"

namespace deepspeed {
namespace comm {

// Throws CommError naming the rank unless input and output have the same dtype and the same
// number of elements, a multiple of comm.world_size(). Returns the chunk size.
int64_t check_all_to_all(const Communicator& comm, const at::Tensor& output,
                         const at::Tensor& input);

}  // namespace comm
}  // namespace deepspeed
