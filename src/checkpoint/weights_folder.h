// A folder of weights as Hugging Face lays out a model and ds_to_fp32 writes one (shard_plan.h):
// one file (model.safetensors, pytorch_model.bin) or shards that an index names
// (model.safetensors.index.json, pytorch_model.bin.index.json: {"weight_map": {name: file}}).
// Read by init_inference (tp/shard_loader.cpp) and deepspeed/state_dict_file.h, which this file
// implements for files and folders alike.
// Thread-safety: free functions, no shared state.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/file_system.h"
#include "checkpoint/safetensors.h"

namespace deepspeed {
namespace checkpoint {

// "'<dir>' holds neither a model's weights (<the four names>) nor a training checkpoint (...)":
// what a reader that takes either says of a folder with neither.
std::string neither_weights_nor_checkpoint(const std::string& dir);

// Whether `dir` holds a training checkpoint (a save folder's `latest`, a tag folder's manifest):
// readers that take either look for that before a model's weights.
bool holds_checkpoint(FileSystem& fs, const std::string& dir);

struct WeightsFolder {
  std::string dir;
  std::string index_path;  // the index read; "" for a folder of one file
  // Paths of the one file, or of the index's shards sorted by name (file-number order).
  std::vector<std::string> files;
  // Sharded: the shard (path) of each tensor, the index's weight_map. Empty for one file.
  std::map<std::string, std::string> file_of;
};

// What `dir` holds, looked for in transformers' order: model.safetensors,
// model.safetensors.index.json, pytorch_model.bin, pytorch_model.bin.index.json (a Hub folder
// with both formats is read as safetensors). nullopt when it holds none of them. Whether `dir` is
// a training checkpoint instead (`latest`, manifest.json) is the caller's to ask first.
// CheckpointError naming the index when it is not {"weight_map": {name: file name}}.
std::optional<WeightsFolder> find_weights_folder(FileSystem& fs, const std::string& dir);
// The folder an index describes (a user may name the index itself). CheckpointError as above,
// or naming the index when it does not exist.
WeightsFolder read_weights_index(FileSystem& fs, const std::string& index_path);

// The tensors' names in file order: each file's own order, files in `files`' order. A sharded
// folder holds the tensors its index names, each read from the shard the index gives: a missing
// shard, or one without a tensor the index puts in it, is a CheckpointError naming both.
std::vector<std::string> read_weights_folder_names(FileSystem& fs, const WeightsFolder& folder);
// The same tensors, whole.
NamedTensors read_weights_folder(FileSystem& fs, const WeightsFolder& folder);

}  // namespace checkpoint
}  // namespace deepspeed
