// The full sizes of parameters that ZeRO-3 partitioned: a released parameter holds a slice of its
// values or nothing, so whoever counts parameters (count_parameters, the flops profiler) reads the
// shapes the unit's owner recorded instead: the attached stage-3 engine's layout, or zero::Init's
// shard before initialize(). The owners' types stay private to zero/stage3.
#pragma once
#include <cstdint>
#include <unordered_map>

#include <c10/core/TensorImpl.h>
#include <torch/nn/module.h>

namespace deepspeed {
namespace zero {

// Parameter (by TensorImpl) -> its full number of elements, for every parameter of a ZeRO unit
// in `root` (itself or below) whose owner recorded its shape. Parameters not listed are whole.
std::unordered_map<const c10::TensorImpl*, int64_t> partitioned_parameter_numels(
    const torch::nn::Module& root);

}  // namespace zero
}  // namespace deepspeed
