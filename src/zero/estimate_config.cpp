// zero_memory_options: a parsed ds_config read the way initialize() reads it, for the estimator.
#include <string>

#include "deepspeed/config.h"
#include "deepspeed/errors.h"
#include "deepspeed/memory.h"
#include "optim/onebit_types.h"
#include "util/ascii.h"

namespace deepspeed {
namespace {

int dtype_bytes(const std::string& dtype, int weight_bytes) {
  if (dtype.empty()) return weight_bytes;
  return dtype == "fp32" ? 4 : 2;  // the config keeps fp32, fp16 or bf16 (normalised)
}

// data_types.grad_accum_dtype as initialize() resolves it (memory.h, runtime/build_engine.cpp):
// the key if set, else fp32 for bf16 at stage 0 (DeepSpeed's BF16_Optimizer), else the weights';
// stages 0 and 1 keep a wider width only when something is summed in it (more than one
// micro-step, or a wider communication_data_type), stages 2 and 3 always. 0: the weights'.
int grad_accum_bytes(const Config& c, int weight_bytes) {
  const int stage = c.zero_optimization.stage;
  int bytes = !c.grad_accum_dtype.empty()    ? dtype_bytes(c.grad_accum_dtype, weight_bytes)
              : stage == 0 && c.bf16.enabled ? 4
                                             : weight_bytes;
  if (stage <= 1 && bytes > weight_bytes && c.gradient_accumulation_steps <= 1 &&
      dtype_bytes(c.communication_data_type, weight_bytes) <= weight_bytes)
    bytes = weight_bytes;
  return bytes == weight_bytes ? 0 : bytes;
}

// The optimizer's state arrays per element besides its master (optim/optimizer_factory.cpp builds
// them): libtorch's SGD keeps a momentum buffer only with momentum (its default 0), Lion its one
// momentum, Adagrad its sum; Adam, AdamW, Lamb and the 1-bit family two moments.
int optimizer_moments(const std::string& type, const nlohmann::json& params) {
  if (type == "sgd") {
    const auto momentum = params.find("momentum");
    const bool has_momentum =
        momentum != params.end() && momentum->is_number() && momentum->get<double>() != 0.0;
    return has_momentum ? 1 : 0;
  }
  if (type == "lion" || type == "adagrad") return 1;
  return 2;
}

}  // namespace

ZeroMemoryOptions zero_memory_options(const Config& c, int world_size, bool gpu) {
  if (world_size < 1)
    throw ConfigError("zero_memory_options: world size " + std::to_string(world_size) +
                      " must be >= 1");
  const auto& z = c.zero_optimization;
  ZeroMemoryOptions o;
  o.world_size = world_size;
  o.stage = z.stage;
  o.mixed_precision = c.fp16.enabled || c.bf16.enabled;
  const int weight_bytes = o.mixed_precision ? 2 : 4;
  o.hpz_partition_size = static_cast<int>(z.zero_hpz_partition_size);
  o.grad_accum_bytes = grad_accum_bytes(c, weight_bytes);
  o.accumulation_steps = static_cast<int>(c.gradient_accumulation_steps);
  // Only FusedAdam (Adam/AdamW) reads 16-bit gradients as they are; the other optimizers step
  // a widened copy. Without an optimizer block (a client optimizer) the estimate is Adam's.
  if (c.optimizer) {
    const std::string type = ascii_lower(c.optimizer->type);
    o.widening_step = type != "adam" && type != "adamw";
    o.optimizer_moments = optimizer_moments(type, c.optimizer->params);
    o.onebit_optimizer = optim::onebit_optimizer_type(type);  // DeepSpeed's spelling (memory.h)
  }
  o.low_precision_masters = (c.fp16.enabled && c.fp16.fp16_master_weights_and_grads) ||
                            (c.bf16.enabled && c.bf16.bf16_master_weights_and_grads);
  o.bf16_moments = o.low_precision_masters && c.bf16.enabled && c.bf16.bf16_optimizer_states;
  o.gpu = gpu;
  o.offload_optimizer = z.offload_optimizer.device;
  o.offload_param = z.offload_param.device;
  o.sub_group_size = z.sub_group_size;
  o.optimizer_buffer_count = static_cast<int>(z.offload_optimizer.buffer_count);
  o.param_buffer_count = static_cast<int>(z.offload_param.buffer_count);
  o.param_max_in_cpu = z.offload_param.max_in_cpu;
  return o;
}

}  // namespace deepspeed
