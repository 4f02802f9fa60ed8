// ds_estimate: the model-state memory a ds_config needs per rank, before training; what
// DeepSpeed users get from estimate_zero2/3_model_states_mem_needs_all_cold, but read from the
// config itself (stage, precision, low-precision masters, offload devices, NVMe sizes):
//   ds_estimate --deepspeed_config ds_config.json --params N [--largest_layer L]
//               [--world_size W] [--ranks_per_node G] [--device cpu|cuda]
//               [--host_gib H] [--gpu_gib D]
// Prints estimate_zero_memory's table of the four stages for the config's placement, then the
// config's own stage: the peak per rank on the GPU, in host memory and in swap files, host memory
// and swap files per node (G ranks), and with --host_gib / --gpu_gib whether that fits. Model
// states only (deepspeed/memory.h says what is counted): activations and the framework's own
// memory come on top. Exit status 0, or 1 on any error (printed: a bad key names it).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "deepspeed/config.h"
#include "deepspeed/errors.h"
#include "deepspeed/memory.h"

namespace {

double gib(int64_t bytes) { return static_cast<double>(bytes) / (int64_t{1} << 30); }

// "fits" / "does not fit" against a budget in GiB (none given: nothing printed).
std::string against(double need_gib, double budget_gib) {
  if (budget_gib <= 0) return "";
  char s[96];
  std::snprintf(s, sizeof s, " (%s %.2f GiB)",
                need_gib <= budget_gib ? "fits in" : "DOES NOT fit in", budget_gib);
  return s;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string config_path, device = "cpu";
  int64_t params = 0, largest_layer = 0;
  int world_size = 1, ranks_per_node = 0;
  double host_gib = 0, gpu_gib = 0;
  CLI::App app{"Model-state memory per rank of a DeepSpeed config, before training"};
  app.add_option("--deepspeed_config", config_path, "the ds_config.json")->required();
  app.add_option("--params", params, "the model's trainable parameter count")->required();
  app.add_option("--largest_layer", largest_layer,
                 "parameters of the largest stage-3 unit (gathered whole; NVMe buffers)");
  app.add_option("--world_size", world_size, "data-parallel ranks (default 1)");
  app.add_option("--ranks_per_node", ranks_per_node,
                 "ranks sharing a node's host memory (default: the world size)");
  app.add_option("--device", device, "compute device: cpu or cuda (default cpu)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--host_gib", host_gib, "host memory of a node, GiB: says whether it fits");
  app.add_option("--gpu_gib", gpu_gib, "memory of one GPU, GiB: says whether it fits");
  CLI11_PARSE(app, argc, argv);
  if (params < 1)
    throw deepspeed::ConfigError("--params " + std::to_string(params) + " must be >= 1");
  if (ranks_per_node < 0 || world_size < 1)
    throw deepspeed::ConfigError("--world_size must be >= 1 and --ranks_per_node >= 1");
  if (ranks_per_node == 0) ranks_per_node = world_size;

  const deepspeed::Config config = deepspeed::load_config(config_path, world_size);
  deepspeed::ZeroMemoryOptions o =
      deepspeed::zero_memory_options(config, world_size, device == "cuda");
  o.largest_layer_params = largest_layer;
  std::printf("%s", deepspeed::format_zero_memory_estimates(params, o).c_str());
  const auto e = deepspeed::estimate_zero_memory(params, o);
  std::printf("\n%s, zero_optimization.stage %d, per rank: peak %.2f GiB", config_path.c_str(),
              o.stage, gib(e.peak()));
  if (o.gpu)
    std::printf(" (%.2f GiB on the GPU%s, %.2f GiB in host memory)", gib(e.peak_device()),
                against(gib(e.peak_device()), gpu_gib).c_str(), gib(e.peak_host()));
  std::printf("\n  host memory of a node (%d ranks): %.2f GiB%s\n", ranks_per_node,
              gib(e.peak_host() * ranks_per_node),
              against(gib(e.peak_host() * ranks_per_node), host_gib).c_str());
  if (e.nvme_bytes > 0)
    std::printf("  swap files of a node: %.2f GiB (%.1f bytes a parameter)\n",
                gib(e.nvme_bytes * ranks_per_node),
                static_cast<double>(e.nvme_bytes) * world_size / params);
  // Over all ranks, against ZeRO-Offload's floor of 12 (fp32 masters and moments).
  std::printf("  host memory a parameter, all ranks together: %.2f bytes\n",
              static_cast<double>(e.peak_host()) * world_size / static_cast<double>(params));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "ds_estimate: error: %s\n", e.what());
  return 1;
}
