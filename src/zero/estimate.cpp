#include <algorithm>
#include <string>

#include "deepspeed/errors.h"
#include "deepspeed/memory.h"
#include "optim/onebit_types.h"
#include "zero/estimate_options.h"

namespace deepspeed {
namespace {

int64_t part(int64_t total, int64_t ways) { return (total + ways - 1) / ways; }
int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// The swap files' alignment (offload/aligned_buffer.h) and the arrays' in a region
// (offload/swapped_adam.cpp).
constexpr int64_t kDirectIo = 4096;
constexpr int64_t kArray = 64;

void check_placement(const std::string& device, const char* key) {
  if (device != "none" && device != "cpu" && device != "nvme")
    throw ConfigError(std::string("estimate_zero_memory: ") + key + " \"" + device +
                      "\" must be \"none\", \"cpu\" or \"nvme\"");
}

void check(int64_t psi, const ZeroMemoryOptions& o) {
  const int n = o.world_size, stage = o.stage;
  if (psi < 0 || n < 1 || stage < 0 || stage > 3)
    throw ConfigError(
        "estimate_zero_memory: need parameters >= 0, world size >= 1, stage 0..3; got " +
        std::to_string(psi) + ", " + std::to_string(n) + ", " + std::to_string(stage));
  const int hpz = std::min(o.hpz_partition_size, n);  // as zero/stage3/zeropp_options.cpp reads it
  if (hpz < 1 || n % hpz != 0)
    throw ConfigError("estimate_zero_memory: zero_optimization.zero_hpz_partition_size " +
                      std::to_string(o.hpz_partition_size) +
                      " must be >= 1 and divide the world size " + std::to_string(n));
  if (o.largest_layer_params < 0 || o.largest_layer_params > psi)
    throw ConfigError("estimate_zero_memory: largest_layer_params " +
                      std::to_string(o.largest_layer_params) + " must be in 0.." +
                      std::to_string(psi) + " (the parameter count)");
  if (o.accumulation_steps < 1)
    throw ConfigError("estimate_zero_memory: accumulation_steps " +
                      std::to_string(o.accumulation_steps) + " must be >= 1");
  const int weight_bytes = o.mixed_precision ? 2 : 4;
  if (o.grad_accum_bytes != 0 && o.grad_accum_bytes != 2 && o.grad_accum_bytes != 4)
    throw ConfigError("estimate_zero_memory: grad_accum_bytes " +
                      std::to_string(o.grad_accum_bytes) +
                      " must be 0 (the weights' width), 2 or 4");
  if (o.grad_accum_bytes != 0 && o.grad_accum_bytes < weight_bytes)
    throw ConfigError("estimate_zero_memory: grad_accum_bytes " +
                      std::to_string(o.grad_accum_bytes) + " is narrower than the " +
                      std::to_string(weight_bytes) +
                      "-byte weights (initialize() refuses such a data_types.grad_accum_dtype)");
  check_placement(o.offload_optimizer, "zero_optimization.offload_optimizer.device");
  check_placement(o.offload_param, "zero_optimization.offload_param.device");
  // initialize()'s rules for the low-precision keys (zero/stage_options.cpp), so that an
  // estimate never describes a run that would be refused. (Offload below its stage is ignored,
  // as initialize() ignores it with a warning.)
  if (o.low_precision_masters && (!o.mixed_precision || stage == 0))
    throw ConfigError("estimate_zero_memory: low-precision masters need a 16-bit model "
                      "(mixed_precision) and stage 1-3");
  if (o.bf16_moments && !o.low_precision_masters)
    throw ConfigError("estimate_zero_memory: bf16.bf16_optimizer_states needs "
                      "bf16.bf16_master_weights_and_grads");
  if (o.low_precision_masters && !o.bf16_moments && o.offload_optimizer == "none")
    throw ConfigError("estimate_zero_memory: low-precision masters with fp32 moments need "
                      "zero_optimization.offload_optimizer.device \"cpu\" (or \"nvme\"), as "
                      "DeepSpeed's CPU Adam");
  // The optimizer's per-element state beside its master (memory.h): initialize() builds only
  // Adam/AdamW for what needs the CPU Adam (16-bit masters, the NVMe swap).
  if (o.optimizer_moments < 0 || o.optimizer_moments > 2)
    throw ConfigError("estimate_zero_memory: optimizer_moments " +
                      std::to_string(o.optimizer_moments) +
                      " must be 0, 1 or 2 (the optimizer's fp32 arrays per element besides its "
                      "master: SGD without momentum 0, Lion/Adagrad/SGD with momentum 1, Adam 2)");
  if (o.optimizer_moments != 2 && o.low_precision_masters)
    throw ConfigError(
        "estimate_zero_memory: low-precision masters need the Adam or AdamW "
        "optimizer (optimizer_moments 2; got " +
        std::to_string(o.optimizer_moments) + ")");
  if (o.optimizer_moments != 2 && stage >= 1 && o.offload_optimizer == "nvme")
    throw ConfigError(
        "estimate_zero_memory: zero_optimization.offload_optimizer.device \"nvme\" "
        "needs the Adam or AdamW optimizer (optimizer_moments 2; got " +
        std::to_string(o.optimizer_moments) + ")");
  if (!o.onebit_optimizer.empty()) {
    if (optim::onebit_optimizer_type(o.onebit_optimizer) != o.onebit_optimizer)
      throw ConfigError("estimate_zero_memory: onebit_optimizer \"" + o.onebit_optimizer +
                        "\" is none of \"OneBitAdam\", \"ZeroOneAdam\", \"OneBitLamb\" (or "
                        "\"\" for another optimizer)");
    if (stage >= 1)
      throw ConfigError("estimate_zero_memory: zero_optimization.stage = " + std::to_string(stage) +
                        " with optimizer.type \"" + o.onebit_optimizer +
                        "\": the 1-bit optimizers run at stage 0 only (as in DeepSpeed)");
    if (o.optimizer_moments != 2)
      throw ConfigError("estimate_zero_memory: " + o.onebit_optimizer +
                        " keeps Adam's two moments (optimizer_moments 2; got " +
                        std::to_string(o.optimizer_moments) + ")");
  }
  if (o.sub_group_size < 1 || o.optimizer_buffer_count < 1 || o.param_buffer_count < 1 ||
      o.param_max_in_cpu < 0)
    throw ConfigError("estimate_zero_memory: zero_optimization.sub_group_size and the offload "
                      "buffer_count must be >= 1, offload_param.max_in_cpu >= 0");
}

// A 1-bit optimizer's state beside its moments, fp32, once its compressed steps have begun
// (memory.h): the error feedback of the compressed all-reduce (optim/compressed_allreduce.h: a
// worker error of the padded model, a server error of this rank's chunk of it), 0/1 Adam's
// local updates and synchronised parameters, 1-bit Lamb's fresh variance.
int64_t onebit_state_bytes(int64_t psi, int64_t n, const std::string& type) {
  if (type.empty()) return 0;
  const int64_t padded = round_up(psi, 8 * n);
  int64_t bytes = 4 * (padded + padded / n);
  if (type == "ZeroOneAdam") bytes += 8 * psi;
  if (type == "OneBitLamb") bytes += 4 * psi;
  return bytes;
}

// The NVMe optimizer swap (offload/swapped_adam.h): the partition cut into sub-groups, each a
// file region [master | exp_avg | exp_avg_sq] (arrays on 64 bytes, regions on 4096), and a ring
// of min(buffer_count, sub-groups) buffers of a whole sub-group's region in memory, plus a
// landing buffer for one sub-group of fp32 gradients where they are in device memory.
struct SwapBytes {
  int64_t resident = 0, file = 0;
};
SwapBytes optimizer_swap(int64_t partition, const ZeroMemoryOptions& o, int master_bytes,
                         int moment_bytes, bool landing) {
  if (partition == 0) return {};
  const int64_t size = std::min(o.sub_group_size, partition);
  auto region = [&](int64_t n) {
    return round_up(round_up(n * master_bytes, kArray) + 2 * round_up(n * moment_bytes, kArray),
                    kDirectIo);
  };
  const int64_t groups = part(partition, size);
  SwapBytes b;
  b.file = (groups - 1) * region(size) + region(partition - (groups - 1) * size);
  b.resident = std::min<int64_t>(o.optimizer_buffer_count, groups) * region(size) +
               (landing ? round_up(4 * size, kDirectIo) : 0);
  return b;
}

}  // namespace

MemoryEstimate estimate_zero_memory(int64_t psi, const ZeroMemoryOptions& o) {
  check(psi, o);
  const int n = o.world_size, stage = o.stage;
  const int hpz = std::min(o.hpz_partition_size, n);
  const int64_t weight_bytes = o.mixed_precision ? 2 : 4;
  // The gradients the stage keeps, in their accumulation width (memory.h).
  const int64_t grad_bytes = o.grad_accum_bytes != 0 ? o.grad_accum_bytes : weight_bytes;
  // Offload where it applies, as initialize() reads it (config/offload_config.cpp): the
  // optimizer's from stage 1, the parameters' at stage 3.
  const std::string optimizer_home = stage >= 1 ? o.offload_optimizer : "none";
  const std::string param_home = stage == 3 ? o.offload_param : "none";
  const bool opt_cpu = optimizer_home == "cpu", opt_nvme = optimizer_home == "nvme";
  const bool param_off = param_home != "none", param_nvme = param_home == "nvme";
  MemoryEstimate e;

  // Parameters: whole below stage 3; stage 3's partition, with offload_param "nvme" a prefix of
  // max_in_cpu elements in memory, the rest in a file read through buffer_count buffers the size
  // of a unit's slice (offload/param_store.h; units taken as largest_layer_params each).
  const int64_t partition = stage >= 3 ? part(psi, n) : psi;
  int64_t param_file = 0;
  e.parameters = weight_bytes * partition;
  if (param_nvme && partition > o.param_max_in_cpu) {
    const int64_t in_file = partition - o.param_max_in_cpu;
    param_file = weight_bytes * in_file;
    // The pool: one buffer a unit in the file, at most buffer_count.
    const int64_t slice = part(o.largest_layer_params, n);
    const int64_t buffers =
        slice == 0 ? 0 : std::min<int64_t>(o.param_buffer_count, part(in_file, slice));
    e.parameters = weight_bytes * o.param_max_in_cpu +
                   buffers * round_up(weight_bytes * slice, kDirectIo);
  }

  // Gradients (memory.h): stage 1 reduce-scatters at the boundary unless it accumulates wider
  // than its weights (then it all-reduces its full buffer); stage 3 with the optimizer on NVMe
  // swaps its partition into a file (offload/grad_store.h), holding a unit's slice at a time.
  e.gradients = stage >= 2 ? part(grad_bytes * psi, n) : grad_bytes * psi;
  const bool accumulating = o.accumulation_steps > 1;
  const bool stage1_scatters = stage == 1 && !(accumulating && grad_bytes > weight_bytes);
  if (stage1_scatters)
    e.gradients = part(grad_bytes * psi, n) + (accumulating ? weight_bytes * psi : 0);
  int64_t grad_file = 0;
  if (stage == 3 && opt_nvme) {
    grad_file = part(grad_bytes * psi, n);
    e.gradients = grad_bytes * part(o.largest_layer_params, n);
  }

  // Optimizer: its moments (Adam's two, fp32 or bf16 with bf16_moments; Lion's one...) and the
  // master, which is the
  // partition itself (no bytes of its own) where the partition is of the master's dtype and in
  // memory beside the update (zero/shard_optimizer.cpp: aliased), else a copy: fp32 masters of a
  // 16-bit model; on a GPU the host copy of ZeRO-Offload, or the device copy of stage 3's
  // offloaded partition without offload_optimizer; a partition partly in a file.
  const int64_t master_bytes = o.low_precision_masters || !o.mixed_precision
                                   ? weight_bytes
                                   : 4;
  const int64_t moment_bytes = o.optimizer_moments * (o.bf16_moments ? 2 : 4);
  // (ZeRO-Offload's host copy is made only of a partition on the GPU: stage 3's offloaded one is
  // already in host memory.)
  const bool master_is_partition = master_bytes == weight_bytes &&
                                   !(o.gpu && opt_cpu && !param_off) &&
                                   !(o.gpu && param_off && optimizer_home == "none") &&
                                   param_file == 0;
  const int64_t optim_partition = stage >= 1 ? part(psi, n) : psi;
  int64_t optim_file = 0;
  if (opt_nvme) {
    // Stages 1 and 2 on a GPU bring each sub-group's gradients down into a landing buffer.
    const auto swap = optimizer_swap(optim_partition, o, static_cast<int>(master_bytes),
                                     static_cast<int>(moment_bytes / 2), o.gpu && stage < 3);
    e.optimizer_states = swap.resident;
    optim_file = swap.file;
  } else {
    e.optimizer_states =
        optim_partition * ((master_is_partition ? 0 : master_bytes) + moment_bytes);
  }
  e.optimizer_states += onebit_state_bytes(psi, n, o.onebit_optimizer);
  // ZeRO-Offload on a GPU with an optimizer other than Adam (widening_step): no CPU Adam reads
  // the gradients as they arrive, so the gradient partition stays on the GPU and the step copies
  // it down into an fp32 host buffer kept for the run (shard_optimizer.cpp: offloaded_step).
  const bool host_grad_copy = o.gpu && opt_cpu && !param_off && o.widening_step;
  if (host_grad_copy) e.optimizer_states += 4 * optim_partition;
  // Stage 1 all-reducing a full buffer on a GPU (it accumulates wider than its weights) under
  // ZeRO-Offload's CPU Adam: each range of its partition's slice comes down into a host landing
  // buffer of the buffer's width, kept for the run (zero/step_during_backward.cpp; the
  // MemoryReport counts it with the optimizer's bytes).
  if (o.gpu && opt_cpu && stage == 1 && !stage1_scatters && !o.widening_step)
    e.optimizer_states += grad_bytes * optim_partition;
  e.nvme_bytes = param_file + grad_file + optim_file;

  // Where they are: all in host memory on the CPU; on a GPU the offloaded parts.
  if (!o.gpu) {
    e.host_bytes = e.model_states();
  } else {
    const bool optimizer_on_host = opt_cpu || opt_nvme;
    // The gradient partition is in host memory where the update reads it there
    // (ShardOptimizer::gradients_in_host_memory): ZeRO-Offload's at every stage that reduces into
    // a partition (stage 1 too, unless it all-reduces a full buffer; its .grad between the
    // micro-steps stay on the GPU), and stage 3's swapped gradients. Stages 1-2 with the
    // optimizer swapped keep it on the GPU and copy a sub-group at a time down into the landing
    // buffer (in optimizer_states).
    int64_t host_gradients = 0;
    if (opt_cpu && stage >= 2) host_gradients = e.gradients;
    if (opt_cpu && stage1_scatters) host_gradients = part(grad_bytes * psi, n);
    if (host_grad_copy) host_gradients = 0;  // on the GPU; their fp32 copy is in the optimizer's
    if (opt_nvme && stage == 3) host_gradients = e.gradients;
    e.host_bytes = (param_off ? e.parameters : 0) + host_gradients +
                   (optimizer_on_host ? e.optimizer_states : 0);
  }

  // hpZ: 1/hpz of every gathered unit, in the parameters' dtype (memory.h).
  if (stage == 3 && hpz > 1) e.hpz_secondary = part(weight_bytes * psi, hpz);
  // 16-bit gradients and a step that widens them: its fp32 copy of the gradient partition
  // (shard_optimizer.cpp). Stage 0 steps one replicated partition, all Ψ. fp32 gradients (an fp32
  // model, or fp32 accumulation) are stepped in place; Adam/AdamW reads 16-bit ones (memory.h).
  if (grad_bytes < 4 && o.widening_step && !host_grad_copy)
    e.step_transient = stage >= 1 ? part(4 * psi, n) : 4 * psi;
  // Left out: the gradient norm's scratch (zero/tensor_facts.cpp's sum_of_squares: none for a
  // contiguous partition in host memory, else at most 4 MiB on the CPU; on a GPU the norm kernel
  // holds only its result). Bounded whatever Ψ; docs/monitoring.md says so.
  // Stage 3: the largest unit whole, weights gathered and gradient before its reduce-scatter.
  // (Its gradient as autograd produces it, in the weights' dtype, whatever the accumulation's.)
  if (stage == 3) e.largest_layer_working = 2 * weight_bytes * o.largest_layer_params;
  // The widening step runs where the update does; the gathered layer and hpZ's copies are on the
  // compute device.
  if (!o.gpu)
    e.host_transient = e.hpz_secondary + e.step_transient + e.largest_layer_working;
  else if (optimizer_home != "none")
    e.host_transient = e.step_transient;
  return e;
}

ZeroMemoryOptions positional_zero_memory_options(int n, int stage, bool mixed_precision,
                                                 int hpz_partition_size,
                                                 int64_t largest_layer_params,
                                                 int grad_accum_bytes, bool widening_step,
                                                 int accumulation_steps) {
  ZeroMemoryOptions o;
  o.world_size = n;
  o.stage = stage;
  o.mixed_precision = mixed_precision;
  o.hpz_partition_size = hpz_partition_size;
  o.largest_layer_params = largest_layer_params;
  o.grad_accum_bytes = grad_accum_bytes;
  o.widening_step = widening_step;
  o.accumulation_steps = accumulation_steps;
  return o;
}

MemoryEstimate estimate_zero_memory(int64_t psi, int n, int stage, bool mixed_precision,
                                    int hpz_partition_size, int64_t largest_layer_params,
                                    int grad_accum_bytes, bool widening_step,
                                    int accumulation_steps) {
  return estimate_zero_memory(
      psi, positional_zero_memory_options(n, stage, mixed_precision, hpz_partition_size,
                                          largest_layer_params, grad_accum_bytes, widening_step,
                                          accumulation_steps));
}

}  // namespace deepspeed
