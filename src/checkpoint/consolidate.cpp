#include "checkpoint/consolidate.h"

#include <algorithm>
#include <set>

#include <torch/torch.h>

#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "checkpoint/tag_reader.h"
#include "checkpoint/tag_replacement.h"
#include "deepspeed/errors.h"
#include "deepspeed/zero_to_fp32.h"

namespace deepspeed {
namespace checkpoint {

std::string resolve_tag_dir(FileSystem& fs, const std::string& path, const std::string& tag) {
  if (!fs.exists(path)) throw CheckpointError("checkpoint path '" + path + "' does not exist");
  if (tag.empty() && fs.exists(join_path(path, kManifestFileName))) return path;
  std::string t = tag.empty() ? read_latest_tag(fs, path) : tag;
  if (t.empty())
    throw CheckpointError("'" + path + "' is neither a checkpoint tag folder (no " +
                          kManifestFileName + ") nor a save folder with a '" + kLatestFileName +
                          "' file; name the tag");
  return tag_dir_to_read(fs, join_path(path, t));
}

NamedTensors consolidate_trainable(FileSystem& fs, const std::string& tag_dir, const std::string& kind) {
  TagReader reader(fs, tag_dir);
  const auto kinds = state_kinds(reader.optimizer_format());
  if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end())
    throw CheckpointError("checkpoint '" + tag_dir + "' has no " + kind +
                          " fragments (optimizer format \"" + reader.optimizer_format() + "\")");
  NamedTensors out;
  for (const auto& t : reader.trainable()) {
    at::Tensor whole = torch::empty({t.numel});
    reader.read_range(kind, t.name, 0, whole);
    out.emplace_back(t.name, whole.view(t.shape));
  }
  return out;
}

namespace {

// Every model-states file's "shared_params" ({alias: first name}; a pipeline has one file per
// stage), merged. A checkpoint saved before they were recorded has none.
std::map<std::string, std::string> shared_params(TagReader& reader) {
  std::map<std::string, std::string> out;
  const std::string tail = "_model_states.safetensors";
  for (const auto& [file, entry] : reader.manifest().files) {
    if (file.rfind("mp_rank_", 0) != 0 || file.size() < tail.size() ||
        file.compare(file.size() - tail.size(), tail.size(), tail) != 0)
      continue;
    const auto meta = reader.file_metadata(file);
    const auto shared = meta.value("shared_params", nlohmann::json::object());
    for (auto it = shared.begin(); it != shared.end(); ++it)
      out[it.key()] = it.value().get<std::string>();
  }
  return out;
}

// The buffers' names in module file `mf` (its "buffer_names", without the file's prefix).
std::set<std::string> buffer_names(TagReader& reader, const ModuleFile& mf) {
  const auto meta = reader.file_metadata(mf.file);
  if (!meta.contains("buffer_names"))
    throw CheckpointError("checkpoint file '" + join_path(reader.dir(), mf.file) +
                          "' has no \"buffer_names\": its frozen parameters cannot be told from "
                          "its buffers to exclude them");
  return meta.at("buffer_names").get<std::set<std::string>>();
}

}  // namespace

NamedTensors consolidate_fp32(FileSystem& fs, const std::string& tag_dir,
                              bool exclude_frozen_parameters) {
  auto trainable = consolidate_trainable(fs, tag_dir, "fp32");
  std::map<std::string, at::Tensor> fp32(trainable.begin(), trainable.end());
  TagReader reader(fs, tag_dir);
  // A tied parameter's master is saved once, under its first name: its other names take it too
  // (as zero_to_fp32 copies shared_params), not their rounded 16-bit copy in the module file.
  for (const auto& [alias, owner] : shared_params(reader)) {
    auto it = fp32.find(owner);
    if (it != fp32.end()) fp32.emplace(alias, it->second);
  }
  NamedTensors out;
  for (const auto& mf : reader.module_files()) {
    std::set<std::string> buffers;
    if (exclude_frozen_parameters) buffers = buffer_names(reader, mf);
    for (const auto& e : reader.file(mf.file).entries) {
      const std::string name = mf.prefix + e.name;
      auto it = fp32.find(name);
      if (it != fp32.end()) {
        out.emplace_back(name, it->second);
        continue;
      }
      if (exclude_frozen_parameters && !buffers.count(e.name)) continue;  // a frozen parameter
      at::Tensor t = reader.module_tensor(mf, e.name);  // a tensor-parallel slice merged
      out.emplace_back(name, t.is_floating_point() ? t.to(torch::kFloat) : t);
    }
  }
  return out;
}

}  // namespace checkpoint

std::vector<std::pair<std::string, at::Tensor>> get_fp32_state_dict_from_zero_checkpoint(
    const std::string& checkpoint_dir, const std::string& tag, bool exclude_frozen_parameters) {
  auto& fs = checkpoint::posix_file_system();
  return checkpoint::consolidate_fp32(fs, checkpoint::resolve_tag_dir(fs, checkpoint_dir, tag),
                                      exclude_frozen_parameters);
}

}  // namespace deepspeed
