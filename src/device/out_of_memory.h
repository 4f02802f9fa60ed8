// An allocator's out-of-memory turned into words a DeepSpeed user can act on: where it happened
// (rank, phase, ZeRO stage, device), what was asked (libtorch's own "Tried to allocate ..."), and
// what to try, instead of a CUDA stack.
#pragma once
#include <optional>
#include <string>

#include <c10/core/Device.h>

namespace deepspeed {

// The message to throw when `libtorch_message` reports an out-of-memory; nullopt otherwise.
std::optional<std::string> out_of_memory_message(const std::string& libtorch_message,
                                                 const std::string& where, int zero_stage,
                                                 c10::Device device);

}  // namespace deepspeed
