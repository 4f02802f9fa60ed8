// A ZeroStage seen across the tensor-parallel group: the stage runs over the data-parallel group
// as usual (each tensor-parallel rank reduces its own slices with its data-parallel peers), and
// the global gradient norm counts every parameter once:
//   norm^2 = sum over tensor-parallel ranks of (its split parameters' squares)
//          + the replicated parameters' squares (the same on every rank of the group)
// which is Megatron's rule (count a parameter when it is split or when tp_rank == 0), computed
// with one data-parallel and one tensor-parallel all-reduce. Everything else is the inner
// stage's (any ZeRO stage 0-3).
#pragma once
#include <memory>
#include <vector>

#include "deepspeed/comm.h"
#include "zero/stage.h"

namespace deepspeed {
namespace tp {

// `split`: the trainable parameters that hold a slice (deepspeed::tp::split_parameters).
std::unique_ptr<zero::ZeroStage> tensor_parallel_stage(std::unique_ptr<zero::ZeroStage> inner,
                                                       comm::CommunicatorPtr tensor_group,
                                                       std::vector<at::Tensor> split);

}  // namespace tp
}  // namespace deepspeed
