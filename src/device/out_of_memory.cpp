#include "device/out_of_memory.h"

#include <cstdio>

#include "deepspeed/device.h"

namespace deepspeed {

std::optional<std::string> out_of_memory_message(const std::string& libtorch_message,
                                                 const std::string& where, int zero_stage,
                                                 c10::Device device) {
  if (libtorch_message.find("out of memory") == std::string::npos) return std::nullopt;
  // libtorch's first sentence names the bytes asked ("Tried to allocate 2.00 GiB"); the rest
  // (allocator tuning advice) is kept short.
  std::string asked = libtorch_message;
  if (auto cut = asked.find(" of which"); cut != std::string::npos) asked = asked.substr(0, cut);
  const auto mem = device_memory(device);
  char held[96] = "";
  if (device.is_cuda())
    std::snprintf(held, sizeof held, "; tensors held %.2f GiB, peak %.2f GiB, of %.2f GiB",
                  mem.allocated / 1073741824.0, mem.allocated_peak / 1073741824.0,
                  mem.total / 1073741824.0);
  const char* hint =
      zero_stage < 3
          ? "a higher zero_optimization.stage, \"offload_optimizer\": {\"device\": \"cpu\"}, or a "
            "smaller train_micro_batch_size_per_gpu"
          : "\"offload_param\" and \"offload_optimizer\" to \"cpu\" or \"nvme\", lower "
            "stage3_max_live_parameters / stage3_prefetch_bucket_size, or a smaller "
            "train_micro_batch_size_per_gpu";
  return "out of " + std::string(device.is_cuda() ? "GPU" : "host") + " memory on " +
         device.str() + " in " + where + " (zero stage " + std::to_string(zero_stage) + "): " +
         asked + held + ". Try " + hint;
}

}  // namespace deepspeed
