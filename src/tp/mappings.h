// The plain (not differentiable) collectives behind deepspeed/tp.h's mappings, for layers and
// for inference code that runs without autograd.
#pragma once
#include <ATen/Tensor.h>

#include "deepspeed/comm.h"

namespace deepspeed {
namespace tp {

// A sum over the group in a new tensor (x untouched). COLLECTIVE.
at::Tensor all_reduce_sum(const at::Tensor& x, comm::Communicator& group);
// [..., n] on every rank -> [..., N n], rank r's block r. COLLECTIVE.
at::Tensor all_gather_last_dim(const at::Tensor& x, comm::Communicator& group);
// [..., N n] -> this rank's [..., n]. Local.
at::Tensor own_slice_last_dim(const at::Tensor& x, comm::Communicator& group);

}  // namespace tp
}  // namespace deepspeed
