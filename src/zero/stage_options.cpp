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

namespace {

// fp16.fp16_master_weights_and_grads / bf16.bf16_master_weights_and_grads: the key that asks for
// 16-bit masters, or empty, after DeepSpeed's checks (its config and ZeRO optimizer asserts).
std::string low_precision_masters(const Config& config) {
  const bool fp16 = config.fp16.fp16_master_weights_and_grads;
  const bool bf16 = config.bf16.bf16_master_weights_and_grads;
  if (!fp16 && !bf16) return "";
  const std::string key =
      fp16 ? "fp16.fp16_master_weights_and_grads" : "bf16.bf16_master_weights_and_grads";
  const int stage = config.zero_optimization.stage;
  if (stage < 1 || stage > 3)
    throw ConfigError("config key '" + key + "' needs ZeRO stage 1, 2 or 3 (zero_optimization." +
                      "stage is " + std::to_string(stage) + "), as in DeepSpeed");
  const std::string device = config.zero_optimization.offload_optimizer.device;
  // fp32 moments beside 16-bit masters: DeepSpeed's CPU Adam is the optimizer that keeps them.
  // The NVMe swap's update is that CPU Adam too (offload/swapped_adam.h).
  const bool cpu_update_needed = fp16 || !config.bf16.bf16_optimizer_states;
  if (cpu_update_needed && device != "cpu" && device != "nvme")
    throw ConfigError(
        "config key '" + key + "' needs zero_optimization.offload_optimizer.device \"cpu\" (or "
        "\"nvme\") " +
        (fp16 ? std::string("(fp16 masters are updated by the CPU Adam, as in DeepSpeed)")
              : std::string("unless bf16.bf16_optimizer_states is true (bf16 masters with fp32 "
                            "moments are updated by the CPU Adam, as in DeepSpeed)")) +
        "; offload_optimizer.device is \"" + device + "\"");
  // "and grads": the gradient partition is in the model's 16 bits.
  if (config.grad_accum_dtype == "fp32")
    throw ConfigError("config key '" + key + "' keeps the gradients in 16 bits, but "
                      "data_types.grad_accum_dtype is \"fp32\"; remove one of them");
  return key;
}

}  // namespace

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
  s.low_precision_masters = low_precision_masters(config);
  s.bf16_moments = config.bf16.bf16_optimizer_states;
  return s;
}

}  // namespace zero
}  // namespace deepspeed
