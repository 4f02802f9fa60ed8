#include "zero/stage_options.h"

#include <algorithm>
#include <utility>

#include "deepspeed/errors.h"
#include "precision/overflow_vote.h"

namespace deepspeed {
namespace zero {

// The one place the device string is read; the config parser has already refused any other
// value, naming the key.
OffloadDevice offload_device(const OffloadConfig& config) {
  static const std::pair<const char*, OffloadDevice> kDevices[] = {
      {"none", OffloadDevice::kNone}, {"cpu", OffloadDevice::kCpu}, {"nvme", OffloadDevice::kNvme}};
  for (const auto& [name, device] : kDevices)
    if (config.device == name) return device;
  throw ConfigError("offload device \"" + config.device + "\" is not one of none, cpu, nvme");
}

ReductionOptions reduction_options(const Config& config) {
  ReductionOptions r;
  r.bucket_numel = std::max<int64_t>(1, config.zero_optimization.reduce_bucket_size);
  r.overlap = config.zero_optimization.overlap_comm_enabled();
  r.comm_dtype = config.communication_data_type;
  r.prescale = config.prescale_gradients;
  r.predivide_factor = config.gradient_predivide_factor;
  r.release_gradients = config.zero_optimization.release_gradients;
  return r;
}

bool releases_gradients(const ReductionOptions& options, c10::Device device) {
  return options.release_gradients.value_or(device.is_cuda());
}

ShardOptions shard_options(const Config& config) {
  const auto& off = config.zero_optimization.offload_optimizer;
  ShardOptions s;
  s.home = offload_device(off);
  s.nvme_path = off.nvme_path;
  s.buffer_count = off.buffer_count;
  s.pin_memory = off.pin_memory;
  s.sub_group_size = config.zero_optimization.sub_group_size;
  s.aio = config.aio;
  // An update during backward cannot be taken back: not when the step may be skipped on an
  // overflow (fp16, bf16.check_grad_overflow) or scales the gradients (fp16, clipping).
  s.overlap_step_allowed =
      !precision::votes_on_overflow(config) && config.gradient_clipping <= 0.0;
  s.overlap_step = off.overlap_step;
  s.overlap_forward = off.overlap_forward;
  return s;
}

}  // namespace zero
}  // namespace deepspeed
