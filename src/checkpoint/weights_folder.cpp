#include "checkpoint/weights_folder.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "checkpoint/shard_plan.h"
#include "checkpoint/weights_file.h"
#include "deepspeed/errors.h"
#include "deepspeed/state_dict_file.h"
#include "util/text.h"

namespace deepspeed {
namespace checkpoint {

namespace {

constexpr const char* kFolderNames =
    "model.safetensors, model.safetensors.index.json, pytorch_model.bin or "
    "pytorch_model.bin.index.json";

bool is_index_name(const std::string& name) {
  return name == kHfIndexFileName || name == kHfTorchSaveIndexFileName;
}

// Whether the folder's tensors include `name` as held by `file` (a shard may hold tensors its
// index does not name: they are not the model's).
bool belongs(const WeightsFolder& folder, const std::string& name, const std::string& file) {
  if (folder.index_path.empty()) return true;
  const auto it = folder.file_of.find(name);
  return it != folder.file_of.end() && it->second == file;
}

// Every tensor the index puts in `shard` is among `held`.
void check_shard(const WeightsFolder& folder, const std::string& shard,
                 const std::set<std::string>& held) {
  for (const auto& [name, file] : folder.file_of)
    if (file == shard && !held.count(name))
      throw CheckpointError("index '" + folder.index_path + "' puts tensor \"" + name +
                            "\" in '" + shard + "', which does not hold it");
}

void require_shard(FileSystem& fs, const WeightsFolder& folder, const std::string& shard) {
  if (!folder.index_path.empty() && !fs.exists(shard))
    throw CheckpointError("shard '" + shard + "' named by index '" + folder.index_path +
                          "' does not exist");
}

}  // namespace

bool holds_checkpoint(FileSystem& fs, const std::string& dir) {
  return fs.exists(join_path(dir, kLatestFileName)) || fs.exists(join_path(dir, kManifestFileName));
}

std::string neither_weights_nor_checkpoint(const std::string& dir) {
  return "'" + dir + "' holds neither a model's weights (" + kFolderNames +
         ") nor a training checkpoint (a 'latest' file, or manifest.json)";
}

WeightsFolder read_weights_index(FileSystem& fs, const std::string& index_path) {
  if (!fs.exists(index_path))
    throw CheckpointError("index '" + index_path + "' does not exist");
  WeightsFolder folder;
  folder.dir = parent_dir(index_path);
  folder.index_path = index_path;
  std::set<std::string> shards;
  try {
    const auto index = nlohmann::json::parse(fs.read_file(index_path));
    for (const auto& [name, file] : index.at("weight_map").items()) {
      const auto shard = file.get<std::string>();
      // Hugging Face's shards sit beside their index; a path elsewhere is not one of them.
      if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos)
        throw CheckpointError("index '" + index_path + "' puts tensor \"" + name + "\" in \"" +
                              shard + "\", which is not a file name of its folder");
      folder.file_of[name] = join_path(folder.dir, shard);
      shards.insert(folder.file_of[name]);
    }
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError("index '" + index_path +
                          "' is not {\"weight_map\": {name: file}}: " + e.what());
  }
  folder.files.assign(shards.begin(), shards.end());
  return folder;
}

std::optional<WeightsFolder> find_weights_folder(FileSystem& fs, const std::string& dir) {
  for (const char* name : {kHfSingleFileName, kHfIndexFileName, kHfTorchSaveFileName,
                           kHfTorchSaveIndexFileName}) {
    const std::string path = join_path(dir, name);
    if (!fs.exists(path)) continue;
    if (is_index_name(name)) return read_weights_index(fs, path);
    return WeightsFolder{dir, "", {path}, {}};
  }
  return std::nullopt;
}

std::vector<std::string> read_weights_folder_names(FileSystem& fs, const WeightsFolder& folder) {
  std::vector<std::string> names;
  for (const auto& file : folder.files) {
    require_shard(fs, folder, file);
    std::set<std::string> held;
    for (auto& name : read_weights_names(fs, file)) {
      held.insert(name);
      if (belongs(folder, name, file)) names.push_back(std::move(name));
    }
    check_shard(folder, file, held);
  }
  return names;
}

NamedTensors read_weights_folder(FileSystem& fs, const WeightsFolder& folder) {
  NamedTensors tensors;
  for (const auto& file : folder.files) {
    require_shard(fs, folder, file);
    std::set<std::string> held;
    for (auto& [name, tensor] : read_weights(fs, file)) {
      held.insert(name);
      if (belongs(folder, name, file)) tensors.emplace_back(std::move(name), std::move(tensor));
    }
    check_shard(folder, file, held);
  }
  return tensors;
}

}  // namespace checkpoint

namespace {

// The folder `path` names (an index, or a folder holding one of the layouts), or nullopt for a
// file.
std::optional<checkpoint::WeightsFolder> folder_at(checkpoint::FileSystem& fs,
                                                   const std::string& path) {
  if (ends_with(path, ".index.json")) return checkpoint::read_weights_index(fs, path);
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return std::nullopt;
  if (auto folder = checkpoint::find_weights_folder(fs, path)) return folder;
  if (checkpoint::holds_checkpoint(fs, path))
    throw CheckpointError("'" + path + "' is a training checkpoint, not a model's weights: "
                          "ds_to_fp32 exports them (get_fp32_state_dict_from_zero_checkpoint "
                          "reads them)");
  throw CheckpointError(checkpoint::neither_weights_nor_checkpoint(path));
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> load_state_dict_file(const std::string& path) {
  auto& fs = checkpoint::posix_file_system();
  if (auto folder = folder_at(fs, path)) return checkpoint::read_weights_folder(fs, *folder);
  return checkpoint::read_weights(fs, path);
}

std::vector<std::string> state_dict_file_names(const std::string& path) {
  auto& fs = checkpoint::posix_file_system();
  if (auto folder = folder_at(fs, path)) return checkpoint::read_weights_folder_names(fs, *folder);
  return checkpoint::read_weights_names(fs, path);
}

}  // namespace deepspeed
