#include "checkpoint/weights_file.h"

#include "checkpoint/torch_save.h"

namespace deepspeed {
namespace checkpoint {

WeightsFormat weights_format_for(const std::string& path) {
  const std::string suffix = ".safetensors";
  const bool safetensors = path.size() >= suffix.size() &&
                           path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
  return safetensors ? WeightsFormat::safetensors : WeightsFormat::torch_save;
}

const char* weights_format_name(WeightsFormat format) {
  return format == WeightsFormat::safetensors ? "safetensors" : "torch.save";
}

void write_weights_streamed(FileSystem& fs, const std::string& path, WeightsFormat format,
                            const std::vector<SafetensorsEntry>& entries,
                            const SafetensorsMetadata& metadata,
                            const std::function<void(TensorSink&)>& fill) {
  if (format == WeightsFormat::safetensors)
    return write_safetensors_streamed(fs, path, entries, metadata,
                                      [&](SafetensorsWriter& w) { fill(w); });
  write_torch_save_streamed(fs, path, entries, [&](TorchSaveWriter& w) { fill(w); });
}

void write_weights(FileSystem& fs, const std::string& path, WeightsFormat format,
                   const NamedTensors& tensors, const SafetensorsMetadata& metadata) {
  if (format == WeightsFormat::safetensors) return write_safetensors(fs, path, tensors, metadata);
  write_torch_save(fs, path, tensors);
}

}  // namespace checkpoint
}  // namespace deepspeed
