// DeepSpeed's model-state estimators, formula for formula (deepspeed/memory.h has the table).
// Each figure is computed as DeepSpeed's Python computes it, left to right in double where
// Python turns to float, and truncated as its int() does, so that the bytes agree exactly.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "deepspeed/errors.h"
#include "deepspeed/memory.h"

namespace deepspeed {
namespace {

void check_setup(const char* fn, int64_t total_params, int64_t largest_layer_params,
                 int gpus_per_node, int nodes, double factor) {
  auto fail = [fn](const std::string& what) {
    throw ConfigError(std::string(fn) + ": " + what);
  };
  if (total_params < 0) fail("total_params " + std::to_string(total_params) + " must be >= 0");
  if (largest_layer_params < 0 || largest_layer_params > total_params)
    fail("largest_layer_params " + std::to_string(largest_layer_params) + " must be in 0.." +
         std::to_string(total_params) + " (total_params)");
  if (gpus_per_node < 1)
    fail("num_gpus_per_node " + std::to_string(gpus_per_node) + " must be >= 1");
  if (nodes < 1) fail("num_nodes " + std::to_string(nodes) + " must be >= 1");
  if (!(factor >= 0) || !std::isfinite(factor))
    fail("additional_buffer_factor " + std::to_string(factor) + " must be finite and >= 0");
}

int64_t truncated(double bytes) { return static_cast<int64_t>(bytes); }  // Python's int()

// "  12.34GB" as DeepSpeed's f"{bytes/2**30:7.2f}GB" (width 7, or 6 for the GPU column).
std::string gigabytes(int64_t bytes, int width) {
  char out[48];
  std::snprintf(out, sizeof out, "%*.2fGB", width, static_cast<double>(bytes) / (1 << 30));
  return out;
}

// DeepSpeed's header lines: "HW: Setup with 1 node, 8 GPUs per node." and the model's size in
// whole millions (int(total_params/1e6)).
std::string setup_lines(int64_t total_params, int gpus_per_node, int nodes) {
  return "Estimated memory needed for params, optim states and gradients for a:\n"
         "HW: Setup with " + std::to_string(nodes) + (nodes > 1 ? " nodes, " : " node, ") +
         std::to_string(gpus_per_node) + (gpus_per_node > 1 ? " GPUs" : " GPU") +
         " per node.\nSW: Model with " +
         std::to_string(truncated(static_cast<double>(total_params) / 1e6)) + "M total params";
}

std::string row(const DeepSpeedMemoryNeeds& m, const std::string& options) {
  return " " + gigabytes(m.cpu_bytes, 7) + " | " + gigabytes(m.gpu_bytes, 6) + " | " + options +
         "\n";
}

// DeepSpeed pads the device name to 4 characters (f"{OffloadDeviceEnum.cpu:4}").
const char* offload_device(bool offloaded) { return offloaded ? "cpu " : "none"; }

}  // namespace

DeepSpeedMemoryNeeds estimate_zero2_model_states_mem_needs(int64_t total_params,
                                                           int num_gpus_per_node, int num_nodes,
                                                           bool cpu_offload,
                                                           double additional_buffer_factor) {
  check_setup("estimate_zero2_model_states_mem_needs", total_params, 0, num_gpus_per_node,
              num_nodes, additional_buffer_factor);
  const int64_t total_gpus = int64_t{num_nodes} * num_gpus_per_node;
  DeepSpeedMemoryNeeds m;
  if (cpu_offload) {
    // 16-bit weights on the GPU; fp32 master, moments and gradients on the host.
    m.gpu_bytes = 2 * total_params;
    const int64_t per_param = std::max<int64_t>(4 * total_gpus, 16);
    m.cpu_bytes =
        truncated(static_cast<double>(total_params * per_param) * additional_buffer_factor);
  } else {
    // 2Ψ 16-bit weights + (2 + 4 gradients, 4 master, 8 moments)Ψ/N.
    m.gpu_bytes = 2 * total_params + truncated(static_cast<double>(18 * total_params) /
                                               static_cast<double>(total_gpus));
    m.cpu_bytes = truncated(static_cast<double>(total_params * 4 * num_gpus_per_node) *
                            additional_buffer_factor);
  }
  return m;
}

DeepSpeedMemoryNeeds estimate_zero3_model_states_mem_needs(int64_t total_params,
                                                           int64_t largest_layer_params,
                                                           int num_gpus_per_node, int num_nodes,
                                                           bool cpu_offload,
                                                           bool cpu_offload_params, bool zero_init,
                                                           double additional_buffer_factor) {
  check_setup("estimate_zero3_model_states_mem_needs", total_params, largest_layer_params,
              num_gpus_per_node, num_nodes, additional_buffer_factor);
  const int64_t total_gpus = int64_t{num_nodes} * num_gpus_per_node;
  const double gpus_factor = 1.0 / num_nodes;
  const double f = additional_buffer_factor;
  const double psi = static_cast<double>(total_params);
  DeepSpeedMemoryNeeds m;
  m.largest_layer_bytes = 4 * largest_layer_params;
  // Per node: with zero_init each process builds only its part; without, each of the G
  // processes first holds the whole model (4 bytes per parameter).
  auto host = [&](int64_t per_param) {
    if (zero_init)
      return truncated(static_cast<double>(total_params * per_param) * gpus_factor * f);
    return truncated(psi * std::max(4.0 * num_gpus_per_node, per_param * gpus_factor) * f);
  };
  if (cpu_offload && cpu_offload_params) {
    m.gpu_bytes = m.largest_layer_bytes;
    m.cpu_bytes = host(18);
  } else if (cpu_offload) {
    m.gpu_bytes = m.largest_layer_bytes + truncated(static_cast<double>(2 * total_params) /
                                                    static_cast<double>(total_gpus));
    m.cpu_bytes = host(16);
  } else {
    m.gpu_bytes = m.largest_layer_bytes + truncated(static_cast<double>(18 * total_params) /
                                                    static_cast<double>(total_gpus));
    m.cpu_bytes = truncated(static_cast<double>((zero_init ? largest_layer_params : total_params) *
                                                4 * num_gpus_per_node) * f);
  }
  return m;
}

std::string estimate_zero2_model_states_mem_needs_all_cold(int64_t total_params,
                                                           int num_gpus_per_node, int num_nodes,
                                                           double additional_buffer_factor) {
  std::string out = setup_lines(total_params, num_gpus_per_node, num_nodes) + ".\n";
  out += "  per CPU  |  per GPU |   Options\n";
  for (bool offload : {true, false})
    out += row(estimate_zero2_model_states_mem_needs(total_params, num_gpus_per_node, num_nodes,
                                                     offload, additional_buffer_factor),
               std::string("offload_optimizer=") + offload_device(offload));
  return out;
}

std::string estimate_zero3_model_states_mem_needs_all_cold(int64_t total_params,
                                                           int64_t largest_layer_params,
                                                           int num_gpus_per_node, int num_nodes,
                                                           double additional_buffer_factor) {
  std::string out = setup_lines(total_params, num_gpus_per_node, num_nodes) + ", " +
                    std::to_string(truncated(static_cast<double>(largest_layer_params) / 1e6)) +
                    "M largest layer params.\n";
  out += "  per CPU  |  per GPU |   Options\n";
  for (bool offload : {true, false})
    for (bool offload_params : {true, false}) {
      if (!offload && offload_params) continue;  // DeepSpeed skips it: params need the optimizer's
      for (bool zero_init : {true, false})
        out += row(estimate_zero3_model_states_mem_needs(
                       total_params, largest_layer_params, num_gpus_per_node, num_nodes, offload,
                       offload_params, zero_init, additional_buffer_factor),
                   std::string("offload_param=") + offload_device(offload_params) +
                       ", offload_optimizer=" + offload_device(offload) +
                       ", zero_init=" + (zero_init ? "1" : "0"));
    }
  return out;
}

}  // namespace deepspeed
