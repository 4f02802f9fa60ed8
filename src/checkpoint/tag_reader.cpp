#include "checkpoint/tag_reader.h"

#include <cctype>

#include "checkpoint/layout.h"
#include "deepspeed/errors.h"

namespace deepspeed {
namespace checkpoint {

TagReader::TagReader(FileSystem& fs, std::string tag_dir) : fs_(fs), dir_(std::move(tag_dir)) {
  const std::string manifest_path = join_path(dir_, kManifestFileName);
  if (!fs_.exists(dir_)) throw CheckpointError("checkpoint folder '" + dir_ + "' does not exist");
  if (!fs_.exists(manifest_path))
    throw CheckpointError("checkpoint '" + dir_ + "' is incomplete: '" + manifest_path +
                          "' is missing (the save did not finish)");
  manifest_ = read_manifest(fs_, dir_);
  const auto& m = manifest_.metadata;
  try {
    if (m.value("format", "") != kCheckpointFormat)
      bad("metadata.format is " + m.value("format", std::string("missing")) + ", expected " +
          kCheckpointFormat);
    if (m.at("format_version").get<int>() != kCheckpointFormatVersion)
      bad("format_version " + m.at("format_version").dump() + " is not supported (this build reads " +
          std::to_string(kCheckpointFormatVersion) + ")");
    world_size_ = m.at("world_size").get<int>();
    zero_stage_ = m.at("zero_stage").get<int>();
    optimizer_format_ = m.at("optimizer").at("format").get<std::string>();
    for (const auto& t : m.at("trainable"))
      trainable_.push_back({t.at("name").get<std::string>(), t.at("shape").get<std::vector<int64_t>>(),
                            t.at("numel").get<int64_t>()});
    const auto& parts = m.at("partitions");
    if (static_cast<int>(parts.size()) != world_size_)
      bad("lists " + std::to_string(parts.size()) + " partitions for world_size " +
          std::to_string(world_size_));
    for (int r = 0; r < world_size_; ++r)
      for (const auto& f : parts[r].at("fragments"))
        pieces_[f.at(0).get<std::string>()].push_back({r, f.at(1).get<int64_t>(), f.at(2).get<int64_t>()});
  } catch (const nlohmann::json::exception& e) {
    bad(std::string("metadata is malformed: ") + e.what());
  }
}

void TagReader::bad(const std::string& what) const {
  throw CheckpointError("checkpoint manifest '" + join_path(dir_, kManifestFileName) + "': " + what);
}

const SafetensorsFile& TagReader::file(const std::string& name) {
  auto it = files_.find(name);
  if (it != files_.end()) return it->second;
  auto entry = manifest_.files.find(name);
  if (entry == manifest_.files.end())
    throw CheckpointError("checkpoint file '" + join_path(dir_, name) +
                          "' is not listed in the manifest: the checkpoint does not match its manifest");
  Manifest one;
  one.files[name] = entry->second;
  verify_files(fs_, dir_, one);
  auto parsed = read_safetensors(fs_, join_path(dir_, name));
  auto& index = tensors_[name];
  for (auto& [tname, t] : parsed.tensors) index[tname] = t;
  return files_.emplace(name, std::move(parsed)).first->second;
}

nlohmann::json TagReader::file_metadata(const std::string& name) {
  const auto& f = file(name);
  auto it = f.metadata.find(kMetadataKey);
  if (it == f.metadata.end())
    throw CheckpointError("checkpoint file '" + join_path(dir_, name) + "' has no \"" +
                          kMetadataKey + "\" metadata");
  try {
    return nlohmann::json::parse(it->second);
  } catch (const nlohmann::json::parse_error& e) {
    throw CheckpointError("checkpoint file '" + join_path(dir_, name) + "': metadata is not JSON: " +
                          e.what());
  }
}

at::Tensor TagReader::tensor(const std::string& name, const std::string& tensor) {
  file(name);
  auto& index = tensors_[name];
  auto it = index.find(tensor);
  if (it == index.end())
    throw CheckpointError("checkpoint file '" + join_path(dir_, name) + "' lacks tensor \"" +
                          tensor + "\"");
  return it->second;
}

std::vector<int> TagReader::ranks_holding(const std::string& param, int64_t offset,
                                          int64_t numel) const {
  std::vector<int> out;
  auto it = pieces_.find(param);
  if (it == pieces_.end()) return out;
  for (const auto& p : it->second)
    if (std::min(offset + numel, p.offset + p.numel) > std::max(offset, p.offset))
      out.push_back(p.rank);
  return out;
}

void TagReader::read_range(const std::string& kind, const std::string& param, int64_t offset,
                           at::Tensor dst) {
  const int64_t numel = dst.numel();
  auto it = pieces_.find(param);
  if (it == pieces_.end())
    throw CheckpointError("checkpoint '" + dir_ + "' has no state for parameter \"" + param + "\"");
  int64_t covered = 0;
  for (const auto& p : it->second) {
    const int64_t lo = std::max(offset, p.offset), hi = std::min(offset + numel, p.offset + p.numel);
    if (hi <= lo) continue;
    const std::string file_name = optim_states_file_name(p.rank);
    at::Tensor src = tensor(file_name, fragment_tensor_name(kind, param));
    if (src.numel() != p.numel || src.scalar_type() != at::kFloat)
      throw CheckpointError("checkpoint file '" + join_path(dir_, file_name) + "': tensor \"" +
                            fragment_tensor_name(kind, param) + "\" has " +
                            std::to_string(src.numel()) + " " + c10::toString(src.scalar_type()) +
                            " elements, the manifest says " + std::to_string(p.numel) + " F32");
    dst.narrow(0, lo - offset, hi - lo).copy_(src.narrow(0, lo - p.offset, hi - lo));
    covered += hi - lo;
  }
  if (covered != numel)
    throw CheckpointError("checkpoint '" + dir_ + "': the saved fragments of \"" + param +
                          "\" cover " + std::to_string(covered) + " of elements [" +
                          std::to_string(offset) + ", " + std::to_string(offset + numel) + ")");
}

nlohmann::json safetensors_tensor_list(FileSystem& fs, const std::string& path) {
  auto file = fs.open_file(path);
  unsigned char len_bytes[8];
  if (file->size() < 8) throw CheckpointError("safetensors file '" + path + "' is too short");
  file->read_at(0, len_bytes, 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n > file->size() - 8) throw CheckpointError("safetensors file '" + path + "' is truncated");
  std::string text(n, '\0');
  if (n > 0) file->read_at(8, &text[0], n);
  nlohmann::json out = nlohmann::json::object();
  try {
    const auto header = nlohmann::json::parse(text);  // outlives the loop over its items
    for (const auto& [name, entry] : header.items())
      if (name != "__metadata__") out[name] = {{"dtype", entry.at("dtype")}, {"shape", entry.at("shape")}};
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError("safetensors file '" + path + "': bad header: " + e.what());
  }
  return out;
}

std::string read_latest_tag(FileSystem& fs, const std::string& dir) {
  const std::string path = join_path(dir, kLatestFileName);
  if (!fs.exists(path)) return "";
  std::string tag = fs.read_file(path);
  while (!tag.empty() && std::isspace(static_cast<unsigned char>(tag.back()))) tag.pop_back();
  if (tag.empty()) throw CheckpointError("'" + path + "' is empty: it should name a checkpoint tag");
  return tag;
}

}  // namespace checkpoint
}  // namespace deepspeed
