// offload_param / offload_optimizer blocks of zero_optimization, and their checks against the
// stage.
#include <utility>

#include "config/blocks.h"
#include "deepspeed/errors.h"

namespace deepspeed::config {
namespace {

std::string read_device(ObjectReader& r) {
  std::string device = "none";
  if (const json* v = r.find("device")) {
    device = ascii_lower(to_string(*v, r.path_of("device")));
    if (device != "none" && device != "cpu" && device != "nvme") {
      fail(r.path_of("device"), *v, "one of \"none\", \"cpu\", \"nvme\"");
    }
  }
  return device;
}

void read_param_only(ObjectReader& r, OffloadConfig& out) {
  r.read_count("buffer_size", out.buffer_size);
  r.read_count("max_in_cpu", out.max_in_cpu);
  require_positive(r.path_of("buffer_size"), static_cast<double>(out.buffer_size));
}

void read_optimizer_only(ObjectReader& r, OffloadConfig& out) {
  r.read("pipeline_read", out.pipeline_read);
  r.read("pipeline_write", out.pipeline_write);
  r.read("fast_init", out.fast_init);
  r.read("ratio", out.ratio);
  r.read("overlap_step", out.overlap_step);  // deepspeed.cpp's own key
  r.read("overlap_forward", out.overlap_forward);  // deepspeed.cpp's own key
  require_in_range(r.path_of("ratio"), out.ratio, 0.0, 1.0);
}

}  // namespace

void read_offload(ObjectReader& zero, const std::string& key, bool is_param, OffloadConfig& out) {
  ObjectReader r = zero.child(key);
  out.device = read_device(r);
  r.read("nvme_path", out.nvme_path);
  r.read("pin_memory", out.pin_memory);
  // >= 0, as DeepSpeed's Field(ge=0) (read_count): a store that swaps refuses 0 itself.
  r.read_count("buffer_count", out.buffer_count);
  if (is_param) {
    read_param_only(r, out);
  } else {
    read_optimizer_only(r, out);
  }
  r.finish(UnknownKeys::kError);  // pydantic in DeepSpeed
}

// DeepSpeed ignores offload_param below stage 3 (and all offload at stage 0): keep real configs
// that carry these blocks working, say so, and leave the blocks off so later code sees no
// offload it would not perform. So nvme without nvme_path is refused only where it is used
// (DeepSpeed fails there too, when it builds the swapper).
void validate_offload(const std::string& zero_path, ZeroConfig& zero, Warnings& warnings) {
  const std::string stage = std::to_string(zero.stage);
  if (zero.offload_param.enabled() && zero.stage < 3) {
    warnings.add(zero_path + ".offload_param applies to stage 3 only; ignored at stage " + stage);
    zero.offload_param.device = "none";
  }
  if (zero.offload_optimizer.enabled() && zero.stage == 0) {
    warnings.add(zero_path + ".offload_optimizer needs ZeRO stage 1, 2 or 3; ignored at stage 0");
    zero.offload_optimizer.device = "none";
  }
  const std::pair<const char*, const OffloadConfig*> blocks[] = {
      {"offload_param", &zero.offload_param}, {"offload_optimizer", &zero.offload_optimizer}};
  for (const auto& [key, block] : blocks) {
    if (block->device != "nvme" || !block->nvme_path.empty()) continue;
    const std::string path = zero_path + "." + key;
    throw ConfigError("config key '" + path + ".device' is \"nvme\" but '" + path +
                      ".nvme_path' is not set; give the directory for the swap files");
  }
  if (zero.offload_optimizer.overlap_forward && zero.stage == 3) {
    warnings.add(zero_path + ".offload_optimizer.overlap_forward applies to stages 1 and 2; "
                 "ignored at stage 3 (its units are gathered from the updated partition)");
    zero.offload_optimizer.overlap_forward = false;
  }
  if (zero.offload_optimizer.ratio < 1.0 && zero.stage != 3) {
    throw ConfigError("config key '" + zero_path +
                      ".offload_optimizer.ratio' < 1 (partial "
                      "offload) requires '" +
                      zero_path + ".stage' 3 (stage is " + stage + ")");
  }
  // DeepSpeed's Twin-Flow (ZeRO-Offload++) updates that fraction on the CPU and the rest on the
  // GPU; here the whole update runs where offload_optimizer.device puts it. A config written for
  // it still trains (the same values), only not split: say so instead of ignoring the key.
  if (zero.offload_optimizer.ratio < 1.0 && zero.offload_optimizer.enabled())
    warnings.add(zero_path + ".offload_optimizer.ratio " + json(zero.offload_optimizer.ratio).dump() +
                 ": partial offload (Twin-Flow) is not implemented; the whole optimizer update "
                 "runs on the offload device (as ratio 1)");
}

}  // namespace deepspeed::config
