// format_zero_memory_estimates: estimate_zero_memory's figures for the four stages as a table.
#include <cstdio>
#include <string>
#include <vector>

#include "deepspeed/memory.h"
#include "zero/estimate_options.h"

namespace deepspeed {
namespace {

// MB = 2^20 bytes, as see_memory_usage's "model states (MB)" (monitor/memory_usage.cpp), so the
// two can be read side by side.
double mb(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// The optimizer as the estimate counts it: Adam/AdamW reads 16-bit gradients as they are
// (widening_step false); the others by the moments they keep.
std::string optimizer_words(const ZeroMemoryOptions& o) {
  if (!o.onebit_optimizer.empty())
    return ", " + o.onebit_optimizer + " (its error feedback included; stage 0 only)";
  if (o.optimizer_moments == 2 && !o.widening_step) return ", Adam";
  if (o.optimizer_moments == 0) return ", an optimizer without moments";
  return ", an optimizer with " + std::to_string(o.optimizer_moments) + " moment" +
         (o.optimizer_moments == 1 ? "" : "s") + " an element";
}

std::string setup_line(int64_t psi, const ZeroMemoryOptions& o) {
  const bool fp32_accumulation = o.mixed_precision && o.grad_accum_bytes == 4;
  std::string s = "Estimated model-state memory per rank: " + std::to_string(psi) +
                  " parameters, " + std::to_string(o.world_size) + " ranks, ";
  s += !o.mixed_precision  ? "fp32"
       : fp32_accumulation ? "mixed precision with fp32 gradient accumulation"
                           : "mixed precision";
  s += optimizer_words(o);
  if (o.low_precision_masters)
    s += o.bf16_moments ? " (16-bit masters, bf16 moments)" : " (16-bit masters)";
  if (o.hpz_partition_size > 1) s += ", hpZ groups of " + std::to_string(o.hpz_partition_size);
  if (o.largest_layer_params > 0) s += ", largest layer " + std::to_string(o.largest_layer_params);
  if (o.gpu) s += ", on a GPU";
  if (o.offload_optimizer != "none") s += ", optimizer offloaded to " + o.offload_optimizer;
  if (o.offload_param != "none") s += ", parameters offloaded to " + o.offload_param + " (stage 3)";
  return s + "\n";
}

}  // namespace

std::string format_zero_memory_estimates(int64_t psi, const ZeroMemoryOptions& options) {
  const bool hpz = options.hpz_partition_size > 1;
  const bool nvme = options.offload_optimizer == "nvme" || options.offload_param == "nvme";
  std::string out = setup_line(psi, options);
  std::string transients;
  if (options.largest_layer_params > 0) transients = "stage 3's largest layer";
  if (hpz)
    transients += (transients.empty() ? "" : " and ") + std::string("hpZ's secondary partition");
  out += "  (MB = 2^20 bytes";
  out += transients.empty() ? "" : "; peak adds " + transients;
  if (options.gpu) out += "; on host: of peak, in host memory, the rest in the GPU's";
  if (nvme) out += "; NVMe: in swap files, beside memory";
  out += ")\n";
  // Each column as wide as its header.
  struct Column {
    const char* header;
    int64_t (*bytes)(const MemoryEstimate&);
  };
  std::vector<Column> columns = {
      {"parameters (MB)", [](const MemoryEstimate& e) { return e.parameters; }},
      {"gradients (MB)", [](const MemoryEstimate& e) { return e.gradients; }},
      {"optimizer (MB)", [](const MemoryEstimate& e) { return e.optimizer_states; }}};
  if (hpz)
    columns.push_back(
        {"hpZ secondary (MB)", [](const MemoryEstimate& e) { return e.hpz_secondary; }});
  columns.push_back(
      {"model states (MB)", [](const MemoryEstimate& e) { return e.model_states(); }});
  columns.push_back({"peak (MB)", [](const MemoryEstimate& e) { return e.peak(); }});
  if (options.gpu)
    columns.push_back({"on host (MB)", [](const MemoryEstimate& e) { return e.peak_host(); }});
  if (nvme) columns.push_back({"NVMe (MB)", [](const MemoryEstimate& e) { return e.nvme_bytes; }});
  out += "  stage";
  for (const auto& c : columns) out += std::string(" | ") + c.header;
  out += "\n";
  char cell[64];
  // The 1-bit optimizers run at stage 0 only (config/optimizer_config.cpp refuses the others).
  const int last_stage = options.onebit_optimizer.empty() ? 3 : 0;
  for (int stage = 0; stage <= last_stage; ++stage) {
    ZeroMemoryOptions o = options;
    o.stage = stage;
    // The low-precision keys need stages 1-3 (initialize() refuses them at stage 0): that row
    // is the plain stage 0.
    if (stage == 0) o.low_precision_masters = o.bf16_moments = false;
    const MemoryEstimate e = estimate_zero_memory(psi, o);
    std::snprintf(cell, sizeof cell, "  %5d", stage);
    out += cell;
    for (const auto& c : columns) {
      std::snprintf(cell, sizeof cell, " | %*.1f", static_cast<int>(std::string(c.header).size()),
                    mb(c.bytes(e)));
      out += cell;
    }
    out += "\n";
  }
  return out;
}

std::string format_zero_memory_estimates(int64_t psi, int n, bool mixed_precision,
                                         int hpz_partition_size, int64_t largest_layer_params,
                                         int grad_accum_bytes) {
  // The stage is each row's (format_zero_memory_estimates(psi, options) sets it).
  return format_zero_memory_estimates(
      psi, positional_zero_memory_options(n, /*stage=*/0, mixed_precision, hpz_partition_size,
                                          largest_layer_params, grad_accum_bytes));
}

}  // namespace deepspeed
