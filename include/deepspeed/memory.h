// Model-state memory: what a rank holds (MemoryReport, from Engine::memory_report()) and what the
// ZeRO formulas expect before training (estimate_zero_memory).
#pragma once
#include <cstdint>
#include <string>

namespace deepspeed {

// Model-state bytes held by this rank, measured from the real tensor storages.
struct MemoryReport {
  // Model parameters as the module holds them (+ master copies): the stage's trainable ones, and
  // the frozen ones (requires_grad false), which no stage partitions: whole, at every stage.
  int64_t parameters = 0;
  int64_t gradients = 0;         // gradient storage
  int64_t optimizer_states = 0;  // optimizer moments (and fp32 masters when kept separately)
  int64_t comm_buffers = 0;      // bucket / gather buffers (stage 3: peak gradient buckets)
  // Of comm_buffers, in host memory on a GPU: page-locked copies of gradient buckets on their way
  // into a pageable offloaded partition (peak). Also counted in host_bytes.
  int64_t host_comm_buffers = 0;
  // ZeRO stage 3's gathered working set, beside model_states(): the full parameters gathered now
  // and the high-water mark since initialize(). *_numel: units only (what
  // stage3_max_live_parameters bounds); *_bytes: every gathered buffer, the root unit included.
  int64_t gathered_numel = 0;
  int64_t peak_gathered_numel = 0;
  int64_t gathered_bytes = 0;
  int64_t peak_gathered_bytes = 0;
  // Of total(): the bytes in host memory; the rest is in the compute device's memory. On the
  // CPU that is everything; on a GPU, what offload keeps on the host (ZeRO-Offload's masters,
  // moments and pinned buffers; offload_param's partition; swap buffers).
  int64_t host_bytes = 0;
  // Beside memory: the bytes of this rank's swap files (offload_optimizer / offload_param
  // "nvme": the optimizer's state, stage 3's parameter partition beyond max_in_cpu and, with the
  // optimizer there, its gradient partition). Not in total().
  int64_t nvme_bytes = 0;
  int64_t model_states() const { return parameters + gradients + optimizer_states; }
  int64_t total() const { return model_states() + comm_buffers + gathered_bytes; }
  int64_t device_bytes() const { return total() - host_bytes; }
};

// Expected model-state bytes per rank before training: the ZeRO paper's formulas for Ψ
// parameters over N data-parallel ranks with Adam (two fp32 moments), as this implementation
// holds them. (DeepSpeed's own estimators, formula for formula, are further down.)
//   fp32:            weights 4Ψ, gradients 4Ψ, moments 8Ψ (the weight partition doubles as master)
//   mixed precision: 16-bit weights 2Ψ, 16-bit gradients 2Ψ, fp32 master 4Ψ + moments 8Ψ (K = 12)
// Stage s partitions: 1 → optimizer states, 2 → + gradients, 3 → + weights.
// Stage 1 here reduce-scatters its gradients at the accumulation boundary into a partition, as
// stage 2 does every micro-step: with accumulation_steps 1 its gradients are stage 2's (Ψ/N of
// the gradient bytes, where the ZeRO paper's P_os keeps the full 2Ψ); with accumulation_steps > 1
// autograd's .grad (the weights' width, Ψ of them) are held between the micro-steps besides. Stage
// 1 accumulating wider than its weights (grad_accum_bytes above the weights' with
// accumulation_steps > 1) and stage 1 in a pipeline all-reduce a full buffer instead: the
// gradient bytes · Ψ of the paper (a pipeline is not modelled here).
// Gradients accumulated in fp32 in mixed precision (grad_accum_bytes 4 below): 4Ψ of gradients
// instead of 2Ψ (partitioned from stage 2), e.g. 18Ψ at stage 0, and the step updates from them
// without the widened copy (step_transient 0).
// ZeRO++'s hpZ (stage 3, zero_optimization.zero_hpz_partition_size = h > 1) adds a secondary
// partition: each rank keeps 1/h of every unit it gathered in the forward pass, so the backward
// gather stays inside its group of h ranks. Held from a unit's forward to its backward, all units
// at once at the end of the forward pass: weight bytes · Ψ / h at that peak (2Ψ/h in 16 bits, the
// ZeRO++ paper's figure; 4Ψ/h in fp32). Measured, it is part of MemoryReport::gathered_bytes,
// not of model_states(); here it is its own field, in peak() and not in model_states().
// DeepSpeed's estimate_zero3_model_states_mem_needs takes no hpZ argument and leaves it out.
// Two more transients, also in peak() and not in model_states() (the measured MemoryReport holds
// neither between steps, so model_states() stays comparable with it):
//   step_transient: an fp32 copy of this rank's 16-bit gradient partition for the length of the
//     update, where the optimizer step makes one (`widening_step`; zero/shard_optimizer.cpp):
//     4Ψ/N at stages 1-3, 4Ψ at stage 0 (one replicated partition). deepspeed.cpp's Adam/AdamW
//     reads 16-bit gradients as they are (optim/fused_adam.h: bf16 and fp16, on the CPU and on
//     a GPU): 0, the default. The copy is made for the other optimizers and
//     with DS_DEVICE_ADAM=libtorch on a GPU (DeepSpeed's stages 1/2 always make it). fp32
//     gradients (an fp32 model, or fp32 accumulation) are stepped on themselves: 0 either way.
//   largest_layer_working: stage 3 only, given largest_layer_params L (0: left out): the largest
//     unit gathered whole with its whole gradient, (weight + gradient bytes)·L, 4L in 16 bits.
// Against DeepSpeed (mixed precision, with the widening step): stage 2's peak is 2Ψ + 18Ψ/N, its
// estimate_zero2_model_states_mem_needs exactly; stage 3's is 4L + 20Ψ/N where DeepSpeed's
// estimate_zero3 says 4L + 18Ψ/N (it leaves out the 16-bit gradient partition, 2Ψ/N, that this
// implementation keeps between micro-steps). Adam/AdamW's step here is 4Ψ/N below both.
// DeepSpeed has no stage 0/1 estimator.
struct MemoryEstimate {
  int64_t parameters = 0;        // bytes per rank
  int64_t gradients = 0;
  int64_t optimizer_states = 0;  // moments (+ fp32 master weights in mixed precision)
  int64_t hpz_secondary = 0;     // hpZ's secondary partition at its peak (0 without hpZ)
  int64_t step_transient = 0;    // fp32 copy of the gradient partition during a widening step
  int64_t largest_layer_working = 0;  // stage 3: largest unit gathered + its gradient
  // Where they are (ZeroMemoryOptions below): of model_states(), the bytes in host memory (all
  // of it on the CPU); of the three transients, those in host memory. The rest is the GPU's.
  int64_t host_bytes = 0;
  int64_t host_transient = 0;
  // In swap files (NVMe offload), beside memory: not in model_states(); MemoryReport::nvme_bytes.
  int64_t nvme_bytes = 0;
  int64_t model_states() const { return parameters + gradients + optimizer_states; }
  int64_t peak() const {
    return model_states() + hpz_secondary + step_transient + largest_layer_working;
  }
  int64_t peak_host() const { return host_bytes + host_transient; }
  int64_t peak_device() const { return peak() - peak_host(); }
};

// Everything estimate_zero_memory reads. The first eight are the positional arguments below;
// the rest place the states as initialize() does (zero/shard_optimizer.cpp, offload/):
//   low_precision_masters (DeepSpeed's bf16/fp16_master_weights_and_grads; mixed precision,
//     stages 1-3): a 16-bit master (2 bytes) instead of fp32; with bf16_moments
//     (bf16.bf16_optimizer_states) the two moments in bf16 (4 bytes) instead of fp32 (8).
//   The master is the partition itself (0 bytes of its own) where it has the partition's dtype
//     and sits beside the update: an fp32 model, or 16-bit masters, on the CPU or on a GPU
//     without offload, or stage 3's partition offloaded to the host beside ZeRO-Offload's CPU
//     update. Else it is a copy: fp32 masters of a 16-bit model; on a GPU, the host copy of
//     ZeRO-Offload (offload_optimizer "cpu") of a partition on the GPU and stage 3's device
//     copy when offload_param moves the partition to the host without offload_optimizer; a
//     partition partly in a file. So the optimizer's bytes per partition element: 12 (mixed),
//     8 (fp32 model, or 16-bit masters aliased), 4 (+ bf16 moments), 10 / 6 (a 16-bit master
//     copy).
//   offload_optimizer "cpu": the same bytes in host memory, and the gradient partition there too
//     (at stage 1 where it reduces into one; when it accumulates wider than its weights it
//     all-reduces a full buffer on the GPU, and the CPU Adam's host landing buffer for its
//     partition's slice, of that width, is counted in optimizer_states).
//     "nvme": the state in a file, 12 / 10 / 6 bytes an element (offload/swapped_adam.h:
//     sub-groups of sub_group_size elements, arrays on 64 bytes, regions on 4096); in memory a
//     ring of min(optimizer_buffer_count, sub-groups) whole sub-groups' regions, and on a GPU at
//     stages 1-2 a landing buffer of one sub-group's fp32 gradients (their partition stays on the
//     GPU). At stage 3 the gradient partition goes to a file too (offload/grad_store.h), one
//     unit's slice in memory at a time (largest_layer_params' share; 0 when not given).
//   offload_param (stage 3) "cpu": the parameter partition in host memory. "nvme": its first
//     param_max_in_cpu elements stay in memory (whole units there; counted as elements here), the
//     rest is in a file, read through a pool of buffers of the largest unit's slice (rounded to
//     4096 bytes), one a unit in the file, at most param_buffer_count (none counted when
//     largest_layer_params is not given). Whole units stay in memory: at most max_in_cpu.
//   optimizer_moments: the optimizer's state arrays per element besides its master, fp32 (bf16
//     with bf16_moments): Adam, AdamW, Lamb and the 1-bit optimizers 2, Lion, Adagrad and SGD
//     with momentum 1, SGD without momentum 0. 16-bit masters and the NVMe swap need
//     Adam/AdamW (2).
//   onebit_optimizer: "OneBitAdam", "ZeroOneAdam" or "OneBitLamb" (stage 0 only, 2 moments;
//     "": none), whose state beside the moments is counted in optimizer_states, fp32, as it is
//     once compressed steps begin (optim/compressed_allreduce.h): the error feedback, a worker
//     error of every element and a server error of this rank's 1/N of them (the model padded
//     to 8N elements; each tensor is, by fewer than 8N: left out), 4(N+1)/N bytes an element;
//     0/1 Adam's local updates and parameters at the last sync (8 more, from its phase 2); 1-bit
//     Lamb's fresh variance (4 more; its per-tensor ratios, 16 bytes a tensor, left out).
//   widening_step under ZeRO-Offload on a GPU (offload_optimizer "cpu", the partition on the
//     GPU) means an optimizer other than Adam/AdamW: without the CPU Adam reading gradients as
//     they arrive, the gradient partition stays on the GPU and the step copies it into an fp32
//     host buffer kept for the run (4 bytes an element, counted in optimizer_states).
//   Offload below its stage is ignored, as initialize() ignores it (with a warning). Stage 3's
//   gathered layer and hpZ's secondary partition are on the compute device; the widening step's
//   copy in host memory where the optimizer is offloaded. Left out: page-locked staging buffers
//   (MemoryReport::host_comm_buffers), ZeRO-Offload's host gradient landing buffers.
// Throws ConfigError as the positional form does, for an offload device other than "none",
// "cpu", "nvme", and for low-precision keys initialize() refuses (stage 0, an fp32 model,
// bf16_moments without low_precision_masters, fp32 moments without offload_optimizer).
struct ZeroMemoryOptions {
  int world_size = 1;
  int stage = 0;
  bool mixed_precision = false;
  int hpz_partition_size = 1;
  int64_t largest_layer_params = 0;
  int grad_accum_bytes = 0;
  bool widening_step = false;
  int accumulation_steps = 1;
  bool low_precision_masters = false;
  bool bf16_moments = false;
  bool gpu = false;                          // the compute device is a GPU
  std::string offload_optimizer = "none";    // zero_optimization.offload_optimizer.device
  std::string offload_param = "none";        // zero_optimization.offload_param.device
  int64_t sub_group_size = 1000000000;       // zero_optimization.sub_group_size
  int optimizer_buffer_count = 4;            // offload_optimizer.buffer_count
  int param_buffer_count = 5;                // offload_param.buffer_count
  int64_t param_max_in_cpu = 1000000000;     // offload_param.max_in_cpu
  int optimizer_moments = 2;                 // the optimizer's arrays per element (above)
  std::string onebit_optimizer;              // a 1-bit optimizer's type (above), or ""
};
MemoryEstimate estimate_zero_memory(int64_t num_parameters, const ZeroMemoryOptions& options);
// The options of a parsed ds_config (load_config / parse_config), read as initialize() reads it:
// stage, fp16/bf16, zero_hpz_partition_size, data_types.grad_accum_dtype resolved (above),
// gradient_accumulation_steps, an optimizer other than Adam/AdamW as a widening step, its
// moments (optimizer_moments, SGD's from optimizer.params.momentum), a 1-bit type, the
// low-precision keys of the enabled block, the offload devices and their NVMe sizes.
// largest_layer_params is the model's: set it after. Throws ConfigError for world_size < 1.
struct Config;
ZeroMemoryOptions zero_memory_options(const Config& config, int world_size, bool gpu = false);

// hpz_partition_size: zero_optimization.zero_hpz_partition_size (1: no hpZ; counted at stage 3
// only; above world_size it means world_size, as the engine reads it). largest_layer_params:
// the parameter count of the largest stage-3 unit (DeepSpeed's largest_layer_params; 0: not
// counted; counted at stage 3 only). grad_accum_bytes: bytes per element of the gradients the
// stage keeps (0: the weights' width, 2 in mixed precision, 4 in fp32). initialize() resolves
// it from the config: data_types.grad_accum_dtype if set, else fp32 for bf16 at stage 0
// (DeepSpeed's BF16_Optimizer), else the weights' dtype; stages 0/1 keep that width only with
// gradient_accumulation_steps > 1 or a communication_data_type wider than the weights (one
// micro-step sums nothing), else the weights'; stages 2/3 always keep it. So bf16 at stage 0
// with gradient accumulation is 4. accumulation_steps: gradient_accumulation_steps (stage 1
// only, above).
// REQUIRES: num_parameters >= 0, world_size >= 1, 0 <= stage <= 3, hpz_partition_size >= 1
// dividing world_size, 0 <= largest_layer_params <= num_parameters, grad_accum_bytes 0, 2 or 4
// and not narrower than the weights. Throws ConfigError naming the value otherwise.
MemoryEstimate estimate_zero_memory(int64_t num_parameters, int world_size, int stage,
                                    bool mixed_precision = false, int hpz_partition_size = 1,
                                    int64_t largest_layer_params = 0, int grad_accum_bytes = 0,
                                    bool widening_step = false, int accumulation_steps = 1);
// A table of all four stages for a model, as printed by the estimator (one line per stage; MB
// means 2^20 bytes, as in see_memory_usage; with hpZ a column for its secondary partition).
// "model states" is model_states(); "peak" is peak(), the transients above included.
// grad_accum_bytes applies to every stage (initialize() keeps it at stages 0/1 only as above).
std::string format_zero_memory_estimates(int64_t num_parameters, int world_size,
                                         bool mixed_precision = false, int hpz_partition_size = 1,
                                         int64_t largest_layer_params = 0,
                                         int grad_accum_bytes = 0);
// The same for the placement of `options` (its stage is each row's; the stage-0 row without the
// low-precision keys, which need stage 1-3; a 1-bit optimizer's table has the stage-0 row
// alone). On a GPU an "on host (MB)" column (of peak), with NVMe offload an "NVMe (MB)" one.
std::string format_zero_memory_estimates(int64_t num_parameters, const ZeroMemoryOptions& options);

// DeepSpeed's own estimators, formula for formula (deepspeed/runtime/zero/stage_1_and_2.py and
// stage3.py), to compare with what DeepSpeed prints or budgets. Mixed precision with Adam; Ψ =
// total_params, L = largest_layer_params, G = num_gpus_per_node, N = G · num_nodes GPUs, f =
// additional_buffer_factor (DeepSpeed's default 1.5); each figure truncated to whole bytes as
// DeepSpeed's int() does.
//   ZeRO-2, cpu_offload (offload_optimizer cpu):  GPU 2Ψ           CPU Ψ·max(4N, 16)·f
//   ZeRO-2, no offload:                            GPU 2Ψ + 18Ψ/N   CPU 4Ψ·G·f
//   ZeRO-3, cpu_offload and cpu_offload_params:    GPU 4L           CPU Ψ·(18/nodes)·f
//                                                  zero_init false: CPU Ψ·max(4G, 18/nodes)·f
//   ZeRO-3, cpu_offload only (offload_optimizer):  GPU 4L + 2Ψ/N    CPU Ψ·(16/nodes)·f
//                                                  zero_init false: CPU Ψ·max(4G, 16/nodes)·f
//   ZeRO-3, no offload:                            GPU 4L + 18Ψ/N   CPU 4L·G·f
//                                                  zero_init false: CPU 4Ψ·G·f
// (ZeRO-3 ignores cpu_offload_params without cpu_offload, as DeepSpeed does.) The CPU figure is
// per node: the host memory to load the model (G processes) or to hold the offloaded states.
// Against estimate_zero_memory: DeepSpeed's ZeRO-2 GPU figure is its mixed-precision peak();
// its ZeRO-3 one is 2Ψ/N below (memory.h above).
struct DeepSpeedMemoryNeeds {
  int64_t cpu_bytes = 0;            // per node's CPU memory
  int64_t gpu_bytes = 0;            // per GPU
  int64_t largest_layer_bytes = 0;  // ZeRO-3: 4L (DeepSpeed's third return value); ZeRO-2: 0
};
// REQUIRES: total_params >= 0, num_gpus_per_node >= 1, num_nodes >= 1,
// additional_buffer_factor >= 0, 0 <= largest_layer_params <= total_params. Throws ConfigError
// naming the argument otherwise.
DeepSpeedMemoryNeeds estimate_zero2_model_states_mem_needs(int64_t total_params,
                                                           int num_gpus_per_node = 1,
                                                           int num_nodes = 1,
                                                           bool cpu_offload = true,
                                                           double additional_buffer_factor = 1.5);
DeepSpeedMemoryNeeds estimate_zero3_model_states_mem_needs(int64_t total_params,
                                                           int64_t largest_layer_params,
                                                           int num_gpus_per_node = 1,
                                                           int num_nodes = 1,
                                                           bool cpu_offload = true,
                                                           bool cpu_offload_params = true,
                                                           bool zero_init = true,
                                                           double additional_buffer_factor = 1.5);
// The tables DeepSpeed's estimate_zero{2,3}_model_states_mem_needs_all_cold print, line for line
// (GB = 2^30 bytes; every offload combination DeepSpeed lists), returned rather than printed.
std::string estimate_zero2_model_states_mem_needs_all_cold(int64_t total_params,
                                                           int num_gpus_per_node = 1,
                                                           int num_nodes = 1,
                                                           double additional_buffer_factor = 1.5);
std::string estimate_zero3_model_states_mem_needs_all_cold(int64_t total_params,
                                                           int64_t largest_layer_params,
                                                           int num_gpus_per_node = 1,
                                                           int num_nodes = 1,
                                                           double additional_buffer_factor = 1.5);

}  // namespace deepspeed
