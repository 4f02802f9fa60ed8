#include "zero/grad_partition.h"

#include <torch/torch.h>

#include "device/out_of_memory.h"
#include "zero/host_grad_partition.h"
#include "zero/tensor_facts.h"

namespace deepspeed {
namespace zero {

int64_t GradPartition::bytes() const { return storage_bytes(tensor()); }

DeviceGradPartition::DeviceGradPartition(int64_t numel, at::ScalarType dtype, c10::Device device) {
  AllocatingFor naming("this rank's gradient partition", -1, numel, c10::elementSize(dtype));
  tensor_ = torch::zeros({numel}, torch::TensorOptions().dtype(dtype).device(device));
}

std::shared_ptr<device::CopyFence> DeviceGradPartition::accumulate(int64_t begin,
                                                                   const at::Tensor& reduced) {
  const int64_t n = reduced.numel();
  TORCH_CHECK(begin >= 0 && begin + n <= tensor_.numel(), "DeviceGradPartition: elements [",
              begin, ", ", begin + n, ") outside the partition of ", tensor_.numel());
  tensor_.narrow(0, begin, n).add_(reduced.reshape({-1}));
  return nullptr;
}

at::Tensor DeviceGradPartition::squared_norm() { return sum_of_squares(tensor_).reshape({1}); }

void DeviceGradPartition::clear() { tensor_.zero_(); }

std::unique_ptr<GradPartition> make_grad_partition(int64_t numel, at::ScalarType dtype,
                                                   c10::Device device, bool in_host_memory,
                                                   bool pin) {
  if (in_host_memory)
    return std::make_unique<HostGradPartition>(
        numel, dtype, device, pin,
        pin || device.is_cpu() ? nullptr : device::stream_downloader(device));
  return std::make_unique<DeviceGradPartition>(numel, dtype, device);
}

}  // namespace zero
}  // namespace deepspeed
