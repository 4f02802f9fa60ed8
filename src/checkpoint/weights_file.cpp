#include "checkpoint/weights_file.h"

#include "checkpoint/torch_load.h"
#include "checkpoint/torch_save.h"
#include "deepspeed/errors.h"
#include "util/text.h"

namespace deepspeed {
namespace checkpoint {

WeightsFormat weights_format_for(const std::string& path) {
  return ends_with(path, ".safetensors") ? WeightsFormat::safetensors : WeightsFormat::torch_save;
}

const char* weights_format_name(WeightsFormat format) {
  return format == WeightsFormat::safetensors ? "safetensors" : "torch.save";
}

void write_weights_streamed(FileSystem& fs, const std::string& path, WeightsFormat format,
                            const std::vector<SafetensorsEntry>& entries,
                            const SafetensorsMetadata& metadata,
                            const std::function<void(TensorSink&)>& fill,
                            const StorageOwners& storage_of) {
  if (format == WeightsFormat::safetensors)
    return write_safetensors_streamed(fs, path, entries, metadata,
                                      [&](SafetensorsWriter& w) { fill(w); });
  write_torch_save_streamed(
      fs, path, entries, [&](TorchSaveWriter& w) { fill(w); }, storage_of);
}

void write_weights(FileSystem& fs, const std::string& path, WeightsFormat format,
                   const NamedTensors& tensors, const SafetensorsMetadata& metadata) {
  if (format == WeightsFormat::safetensors) return write_safetensors(fs, path, tensors, metadata);
  write_torch_save(fs, path, tensors);
}

NamedTensors read_weights(FileSystem& fs, const std::string& path) {
  if (weights_format_for(path) == WeightsFormat::safetensors)
    return read_safetensors(fs, path).tensors;
  return read_torch_save(fs, path);
}

std::vector<std::string> read_weights_names(FileSystem& fs, const std::string& path) {
  if (!fs.exists(path)) throw CheckpointError("weights file '" + path + "' does not exist");
  auto file = fs.open_file(path);
  std::vector<std::string> names;
  if (weights_format_for(path) == WeightsFormat::safetensors) {
    for (const auto& e : read_safetensors_index(*file, path).entries) names.push_back(e.name);
  } else {
    for (const auto& t : read_torch_save_index(*file, path).tensors) names.push_back(t.name);
  }
  return names;
}

}  // namespace checkpoint
}  // namespace deepspeed
