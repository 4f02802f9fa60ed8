// What a pipeline.partition method weighs ("parameters", "uniform", "type:<regex>"), and the
// summary of the chosen partition that rank 0 prints. Separate from partition.cpp, whose
// balanced cut is pure arithmetic over weights: weighing needs the layers built, and the
// layers built here are kept for the stage (StageModuleImpl's `built`) instead of built twice.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <torch/nn/modules/container/any.h>

#include "deepspeed/pipe.h"

namespace deepspeed {
namespace pipe {

// The method as layer_weights reads it: names are case-insensitive (DeepSpeed lowers them; a
// "type:" regex keeps its case), "best" is "parameters".
std::string normalized_partition_method(const std::string& method);

// Per-layer weights for `method`; the layers it built to count them (every layer but for
// "uniform", a tied key's module once, under each of its indices) go into `built`. Throws
// ConfigError for an unknown method, a bad regular expression, or a "type:" that matches no layer,
// naming `key`: where the method came from ("pipeline.partition" or
// "PipelineModule.partition_method").
std::vector<int64_t> layer_weights(const std::vector<LayerSpec>& specs, const std::string& method,
                                   const std::string& key, uint64_t seed,
                                   std::map<size_t, torch::nn::AnyModule>& built);

// Prints the stages' layers and parameter counts to stdout (rank 0's job).
void print_partition(const std::vector<LayerSpec>& specs, const Partition& p,
                     const std::string& method);

}  // namespace pipe
}  // namespace deepspeed
