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
      partition_files_.push_back(parts[r].value("file", optim_states_file_name(r)));
    pipeline_stages_ = m.contains("pipeline") ? m.at("pipeline").at("stages").get<int>() : 1;
    engine_file_ = m.value("engine_file", model_states_file_name());
    if (m.contains("module_files"))
      for (const auto& f : m.at("module_files"))
        module_files_.push_back({f.at("file").get<std::string>(), f.at("prefix").get<std::string>(),
                                 f.value("layer", int64_t{-1})});
    else
      module_files_.push_back({model_states_file_name(), "", -1});
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

TagReader::OpenFile& TagReader::open(const std::string& name) {
  auto it = files_.find(name);
  if (it != files_.end()) return it->second;
  auto entry = manifest_.files.find(name);
  if (entry == manifest_.files.end())
    throw CheckpointError("checkpoint file '" + join_path(dir_, name) +
                          "' is not listed in the manifest: the checkpoint does not match its manifest");
  Manifest one;
  one.files[name] = entry->second;
  verify_files(fs_, dir_, one);
  const std::string path = join_path(dir_, name);
  OpenFile f;
  f.file = fs_.open_file(path);
  f.index = read_safetensors_index(*f.file, path);
  return files_.emplace(name, std::move(f)).first->second;
}

const SafetensorsIndex& TagReader::file(const std::string& name) { return open(name).index; }

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

const SafetensorsEntry& TagReader::entry(const std::string& name, const std::string& tensor) {
  const SafetensorsEntry* e = open(name).index.find(tensor);
  if (!e)
    throw CheckpointError("checkpoint file '" + join_path(dir_, name) + "' lacks tensor \"" +
                          tensor + "\"");
  return *e;
}

at::Tensor TagReader::tensor(const std::string& name, const std::string& tensor) {
  const SafetensorsEntry& e = entry(name, tensor);
  at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
  read_tensor(name, tensor, t);
  return t;
}

void TagReader::read_tensor(const std::string& name, const std::string& tensor, at::Tensor dst) {
  const SafetensorsEntry& e = entry(name, tensor);
  if (dst.numel() != e.numel())
    throw CheckpointError("checkpoint file '" + join_path(dir_, name) + "': tensor \"" + tensor +
                          "\" has " + std::to_string(e.numel()) + " elements, read into " +
                          std::to_string(dst.numel()));
  OpenFile& f = open(name);
  if (dst.scalar_type() == e.dtype) {
    read_safetensors_range(*f.file, join_path(dir_, name), f.index, e, 0, dst);
    return;
  }
  at::Tensor saved = at::empty({e.numel()}, at::TensorOptions().dtype(e.dtype));  // converted below
  read_safetensors_range(*f.file, join_path(dir_, name), f.index, e, 0, saved);
  dst.copy_(saved.view(dst.sizes()));
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

template <class Visit>
void TagReader::for_each_piece(const std::string& kind, const std::string& param, int64_t offset,
                               int64_t numel, Visit&& visit) {
  auto it = pieces_.find(param);
  if (it == pieces_.end())
    throw CheckpointError("checkpoint '" + dir_ + "' has no state for parameter \"" + param + "\"");
  int64_t covered = 0;
  const std::string tensor_name = fragment_tensor_name(kind, param);
  for (const auto& p : it->second) {
    const int64_t lo = std::max(offset, p.offset), hi = std::min(offset + numel, p.offset + p.numel);
    if (hi <= lo) continue;
    const std::string& file_name = partition_files_.at(p.rank);
    const SafetensorsEntry& e = entry(file_name, tensor_name);
    if (e.numel() != p.numel || e.dtype != at::kFloat)
      throw CheckpointError("checkpoint file '" + join_path(dir_, file_name) + "': tensor \"" +
                            tensor_name + "\" has " + std::to_string(e.numel()) + " " +
                            c10::toString(e.dtype) + " elements, the manifest says " +
                            std::to_string(p.numel) + " F32");
    visit(file_name, e, lo - p.offset, lo - offset, hi - lo);
    covered += hi - lo;
  }
  if (covered != numel)
    throw CheckpointError("checkpoint '" + dir_ + "': the saved fragments of \"" + param +
                          "\" cover " + std::to_string(covered) + " of elements [" +
                          std::to_string(offset) + ", " + std::to_string(offset + numel) + ")");
}

void TagReader::read_range(const std::string& kind, const std::string& param, int64_t offset,
                           at::Tensor dst) {
  for_each_piece(
      kind, param, offset, dst.numel(),
      [&](const std::string& file_name, const SafetensorsEntry& e, int64_t from, int64_t into,
          int64_t n) {
        OpenFile& f = open(file_name);
        at::Tensor part = dst.narrow(0, into, n);
        if (part.scalar_type() == at::kFloat) {
          read_safetensors_range(*f.file, join_path(dir_, file_name), f.index, e, from, part);
        } else {
          at::Tensor tmp = at::empty({n}, at::kFloat);
          read_safetensors_range(*f.file, join_path(dir_, file_name), f.index, e, from, tmp);
          part.copy_(tmp);
        }
      });
}

void TagReader::check_range(const std::string& kind, const std::string& param, int64_t offset,
                            int64_t numel) {
  for_each_piece(kind, param, offset, numel,
                 [](const std::string&, const SafetensorsEntry&, int64_t, int64_t, int64_t) {});
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
