#include "zero/grad_partition.h"

#include <torch/torch.h>

#include "device/out_of_memory.h"
#include "zero/host_grad_partition.h"
#include "zero/tensor_facts.h"

namespace deepspeed {
namespace zero {

int64_t GradPartition::bytes() const { return storage_bytes(tensor()); }

DeviceGradPartition::DeviceGradPartition(int64_t numel, at::ScalarType dtype, c10::Device device,
                                         bool release)
    : numel_(numel), dtype_(dtype), device_(device), release_(release) {
  if (!release_) allocate(/*zeroed=*/true);  // a releasing one: at its first use
}

DeviceGradPartition::DeviceGradPartition(at::Tensor buffer)
    : tensor_(std::move(buffer)), numel_(tensor_.numel()), dtype_(tensor_.scalar_type()),
      device_(tensor_.device()), adopted_(true) {}

void DeviceGradPartition::allocate(bool zeroed) const {
  AllocatingFor naming("this rank's gradient partition", -1, numel_, c10::elementSize(dtype_));
  const auto options = torch::TensorOptions().dtype(dtype_).device(device_);
  tensor_ = zeroed ? torch::zeros({numel_}, options) : torch::empty({numel_}, options);
}

const at::Tensor& DeviceGradPartition::tensor() const {
  if (!tensor_.defined()) allocate(/*zeroed=*/true);
  return tensor_;
}

const at::Tensor& DeviceGradPartition::acquire_uninitialized() {
  if (!tensor_.defined()) allocate(/*zeroed=*/false);
  return tensor_;
}

void DeviceGradPartition::release() {
  if (release_) tensor_ = at::Tensor();
}

int64_t DeviceGradPartition::bytes() const {
  return adopted_ ? storage_bytes(tensor_) : numel_ * int64_t(c10::elementSize(dtype_));
}

std::shared_ptr<device::CopyFence> DeviceGradPartition::accumulate(int64_t begin,
                                                                   const at::Tensor& reduced) {
  const int64_t n = reduced.numel();
  TORCH_CHECK(begin >= 0 && begin + n <= numel_, "DeviceGradPartition: elements [", begin, ", ",
              begin + n, ") outside the partition of ", numel_);
  tensor().narrow(0, begin, n).add_(reduced.reshape({-1}));
  return nullptr;
}

at::Tensor DeviceGradPartition::squared_norm() { return sum_of_squares(tensor()).reshape({1}); }

void DeviceGradPartition::clear() {
  if (release_)
    tensor_ = at::Tensor();
  else
    tensor_.zero_();
}

std::unique_ptr<GradPartition> make_grad_partition(int64_t numel, at::ScalarType dtype,
                                                   c10::Device device, bool in_host_memory,
                                                   bool pin, bool release) {
  if (in_host_memory)
    return std::make_unique<HostGradPartition>(
        numel, dtype, device, pin,
        pin || device.is_cpu() ? nullptr : device::stream_downloader(device));
  return std::make_unique<DeviceGradPartition>(numel, dtype, device, release);
}

}  // namespace zero
}  // namespace deepspeed
