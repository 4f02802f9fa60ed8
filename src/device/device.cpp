#include "deepspeed/device.h"

#include <torch/cuda.h>

#include <cstdlib>

#include "deepspeed/errors.h"

#ifdef DS_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace deepspeed {

int cuda_device_count() { return static_cast<int>(torch::cuda::device_count()); }

bool cuda_available() { return cuda_device_count() > 0; }

namespace {

c10::Device cuda_for(int index, const std::string& requested) {
  const int count = cuda_device_count();
  if (count == 0)
    throw ConfigError("device \"" + requested + "\": no GPU is available (" +
                      std::string(torch::cuda::is_available() ? "" : "this libtorch has no CUDA or ") +
                      "no GPU is visible); use \"cpu\", or build against a CUDA libtorch "
                      "(docs/gpu.md)");
  if (index >= count)
    throw ConfigError("device \"" + requested + "\": GPU " + std::to_string(index) +
                      " does not exist (" + std::to_string(count) + " visible)");
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
}

}  // namespace

c10::Device resolve_device(const std::string& requested, int local_rank) {
  std::string want = requested;
  if (want.empty() || want == "auto") {
    const char* env = std::getenv("DS_DEVICE");
    want = env && *env ? env : "auto";
  }
  if (want == "auto") {
    if (!cuda_available()) return c10::kCPU;
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank % cuda_device_count()));
  }
  if (want == "cpu") return c10::kCPU;
  if (want == "cuda") return cuda_for(cuda_available() ? local_rank % cuda_device_count() : 0, want);
  if (want.rfind("cuda:", 0) == 0) {
    const std::string digits = want.substr(5);
    if (!digits.empty() && digits.find_first_not_of("0123456789") == std::string::npos &&
        digits.size() < 4)
      return cuda_for(std::stoi(digits), want);
  }
  throw ConfigError("device \"" + want + "\" is not one of \"auto\", \"cpu\", \"cuda\", "
                    "\"cuda:N\"" + (requested.empty() || requested == "auto" ? " (from DS_DEVICE)" : ""));
}

void use_device(c10::Device device) {
#ifdef DS_WITH_CUDA
  if (device.is_cuda() && device.has_index()) c10::cuda::set_device(device.index());
#else
  (void)device;
#endif
}

}  // namespace deepspeed
