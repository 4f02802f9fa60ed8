// GPU memory statistics and caps through libtorch's CUDA caching allocator; on the CPU (or a
// build without CUDA) there is no device memory to count.
#include <string>

#include "deepspeed/device.h"
#include "deepspeed/errors.h"

#ifdef DS_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include "device/cuda_init.h"
#endif

namespace deepspeed {

#ifdef DS_WITH_CUDA
namespace {
namespace alloc = c10::cuda::CUDACachingAllocator;
constexpr size_t kAll = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
}  // namespace

DeviceMemory device_memory(c10::Device device) {
  DeviceMemory m;
  if (!device.is_cuda()) return m;
  device::init_cuda();
  const auto index = device.has_index() ? device.index() : 0;
  const auto stats = alloc::getDeviceStats(index);
  m.allocated = stats.allocated_bytes[kAll].current;
  m.allocated_peak = stats.allocated_bytes[kAll].peak;
  m.reserved_peak = stats.reserved_bytes[kAll].peak;
  m.total = static_cast<int64_t>(at::cuda::getDeviceProperties(index)->totalGlobalMem);
  return m;
}

void reset_device_memory_peaks(c10::Device device) {
  if (!device.is_cuda()) return;
  device::init_cuda();
  alloc::resetPeakStats(device.has_index() ? device.index() : 0);
}

void synchronize_device(c10::Device device) {
  if (!device.is_cuda()) return;
  device::init_cuda();
  at::cuda::getCurrentCUDAStream(device.has_index() ? device.index() : 0).synchronize();
}

void cap_device_memory(c10::Device device, int64_t bytes) {
  if (!device.is_cuda())
    throw ConfigError("a GPU memory cap needs a GPU device, got \"" + device.str() + "\"");
  const int64_t total = device_memory(device).total;
  if (bytes <= 0 || bytes > total)
    throw ConfigError("GPU memory cap of " + std::to_string(bytes) + " bytes is outside (0, " +
                      std::to_string(total) + "] for " + device.str());
  alloc::setMemoryFraction(static_cast<double>(bytes) / static_cast<double>(total),
                           device.has_index() ? device.index() : 0);
}

#else

DeviceMemory device_memory(c10::Device) { return {}; }
void reset_device_memory_peaks(c10::Device) {}
void synchronize_device(c10::Device) {}
void cap_device_memory(c10::Device device, int64_t) {
  throw ConfigError("a GPU memory cap needs a CUDA build and a GPU device, got \"" + device.str() +
                    "\"");
}

#endif

}  // namespace deepspeed
