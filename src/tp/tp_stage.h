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
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "deepspeed/comm.h"
#include "deepspeed/config.h"
#include "deepspeed/topology.h"
#include "zero/stage.h"

namespace deepspeed {
namespace tp {

// The split layers of `module` against the topology the engine was given (`topology` null: none
// given, tensor size 1). Every SplitLayer whose group has more than one rank must sit on a
// tensor-parallel group of that topology: its group's size is the topology's tensor size and
// this rank's place in it is its tensor coordinate. Otherwise the engine would take tensor peers
// for data-parallel ranks: the loader would give them different samples, their different slices
// would be averaged, the norm would miss the tensor group and checkpoints would write rank 0's
// slices as the whole model. Throws ConfigError naming the layer and both sizes; `args` is how
// the caller names its topology ("initialize(): InitializeArgs.topology"). With a topology,
// COLLECTIVE over its world: a rank that finds nothing wrong throws too when another does (a
// group of the right size but other members is wrong on some ranks only). Without one, local.
void check_split_layers(const torch::nn::Module& module, const comm::Topology* topology,
                        const std::string& args);

// initialize()'s tensor-parallel checks, before anything is built: check_split_layers, then what
// the config cannot combine with a tensor size above 1 (ZeRO-3 with offload_optimizer on nvme:
// the gradient partition is on disk, so its norm cannot be split by parameter).
void check_initialize_args(const torch::nn::Module& module, const comm::Topology* topology,
                           const Config& config);

// `split`: the trainable parameters that hold a slice (deepspeed::tp::split_parameters).
std::unique_ptr<zero::ZeroStage> tensor_parallel_stage(std::unique_ptr<zero::ZeroStage> inner,
                                                       comm::CommunicatorPtr tensor_group,
                                                       std::vector<at::Tensor> split);

}  // namespace tp
}  // namespace deepspeed
