// Argument checks shared by every all_gather_into implementation (deepspeed/comm.h).
#pragma once
#include <ATen/Tensor.h>

#include <vector>

#include "deepspeed/comm.h"

namespace deepspeed {
namespace comm {

// Throws CommError naming the rank unless there is one output per rank, each with input's
// dtype and input.numel() elements.
void check_all_gather_into(const Communicator& comm, const std::vector<at::Tensor>& outputs,
                           const at::Tensor& input);

}  // namespace comm
}  // namespace deepspeed
