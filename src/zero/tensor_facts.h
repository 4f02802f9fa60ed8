// Small facts about tensors that every ZeRO stage needs: the bytes a tensor really holds, the one
// dtype a parameter group trains in, a dtype named in the config, and a gradient's sum of squares.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/Tensor.h>

namespace deepspeed {
namespace zero {

// Bytes of the tensor's storage (0 when undefined or released): what the memory report counts.
inline int64_t storage_bytes(const at::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.storage().nbytes()) : 0;
}

// `bytes` if they are in host memory because `device` is the CPU, else 0 (MemoryReport::host_bytes).
inline int64_t host_share(const c10::Device& device, int64_t bytes) {
  return device.is_cpu() ? bytes : 0;
}

// The dtype all of `params` share: fp32, or bf16/fp16 for mixed precision. Throws ConfigError
// naming zero_optimization.stage `stage` for mixed or other dtypes. fp32 when params is empty.
at::ScalarType uniform_param_dtype(int stage, const std::vector<at::Tensor>& params);

// "fp32" / "fp16" / "bf16" (as config/precision_config normalises them); "" gives `fallback`.
at::ScalarType dtype_from_config(const std::string& configured, at::ScalarType fallback);

// The sum of t's squared elements in fp64, as a 0-dim fp64 tensor on t's device (no host sync). Summed a chunk at a time: widening a whole gradient partition to fp64 would hold 16
// bytes per element at once (the widened copy and its square), the largest transient of a step.
at::Tensor sum_of_squares(const at::Tensor& t);

}  // namespace zero
}  // namespace deepspeed
