// A file of weights for others to load (save_16bit_model, ds_to_fp32) or loaded from others
// (init_inference, deepspeed/state_dict_file.h): safetensors or a torch.save pickle, written the
// same way (atomically, tensors streamed in entry order through a TensorSink) and read by name.
// Thread-safety: free functions, no shared state.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "checkpoint/file_system.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/tensor_sink.h"
#include "checkpoint/torch_save.h"

namespace deepspeed {
namespace checkpoint {

enum class WeightsFormat {
  safetensors,  // metadata kept in the header
  torch_save,   // DeepSpeed's default (pytorch_model.bin); metadata is not stored
};

// By the file name, as a user reads it: "*.safetensors" is safetensors, anything else (DeepSpeed's
// pytorch_model.bin, *.pt, *.pth, no extension) a torch.save file.
WeightsFormat weights_format_for(const std::string& path);
const char* weights_format_name(WeightsFormat format);  // "safetensors", "torch.save"

// Whole-file writers of either format. The sink takes each tensor whole (torch.save needs that;
// safetensors would take pieces). IOError / CheckpointError as the format's own writer.
// `storage_of` (torch_save.h): entries that share an earlier one's storage (a tied parameter's
// names); torch.save writes it once, safetensors (which cannot share) a copy per name.
void write_weights_streamed(FileSystem& fs, const std::string& path, WeightsFormat format,
                            const std::vector<SafetensorsEntry>& entries,
                            const SafetensorsMetadata& metadata,
                            const std::function<void(TensorSink&)>& fill,
                            const StorageOwners& storage_of = {});
void write_weights(FileSystem& fs, const std::string& path, WeightsFormat format,
                   const NamedTensors& tensors, const SafetensorsMetadata& metadata = {});

// A file of either format (weights_format_for its name), whole, or its tensors' names alone.
// CheckpointError naming the file.
NamedTensors read_weights(FileSystem& fs, const std::string& path);
std::vector<std::string> read_weights_names(FileSystem& fs, const std::string& path);

}  // namespace checkpoint
}  // namespace deepspeed
