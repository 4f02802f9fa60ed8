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
      slice_trainable_.push_back({t.at("name").get<std::string>(),
                                  t.at("shape").get<std::vector<int64_t>>(), t.at("numel").get<int64_t>()});
    if (m.contains("tensor_parallel")) {
      const auto& tp = m.at("tensor_parallel");
      tensor_size_ = tp.at("size").get<int>();
      if (tensor_size_ < 1 || world_size_ % tensor_size_ != 0)
        bad("tensor_parallel.size " + std::to_string(tensor_size_) +
            " does not divide world_size " + std::to_string(world_size_));
      for (const auto& [name, split] : tp.at("split").items())
        splits_[name] = {split.at("dim").get<int>(), split.at("parts").get<int>()};
    }
    // The unsplit view: a split parameter's shape and size times the tensor size along its dim.
    trainable_ = slice_trainable_;
    for (auto& t : trainable_) {
      auto it = splits_.find(t.name);
      if (it == splits_.end()) continue;
      t.shape = unsplit_shape(t.shape, it->second, tensor_size_);
      t.numel *= tensor_size_;
    }
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
    pieces_.resize(tensor_size_);
    for (int r = 0; r < world_size_; ++r) {
      const int t = parts[r].value("tensor_rank", 0);
      if (t < 0 || t >= tensor_size_) bad("partition " + std::to_string(r) + " has tensor_rank " + std::to_string(t));
      for (const auto& f : parts[r].at("fragments"))
        pieces_[t][f.at(0).get<std::string>()].push_back(
            {r, f.at(1).get<int64_t>(), f.at(2).get<int64_t>()});
    }
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

void TagReader::select_tensor_rank(int t) {
  if (t < 0 || t >= tensor_size_)
    throw CheckpointError("checkpoint '" + dir_ + "' was saved at tensor-parallel size " +
                          std::to_string(tensor_size_) + ": it has no tensor-parallel rank " +
                          std::to_string(t));
  view_ = t;
  trainable_ = slice_trainable_;
  if (tensor_size_ == 1) return;
  module_files_ = {{model_states_file_name(t), "", -1}};
  engine_file_ = model_states_file_name(t);
}

std::vector<int64_t> TagReader::module_tensor_shape(const ModuleFile& f,
                                                    const SafetensorsEntry& e) const {
  auto it = splits_.find(f.prefix + e.name);
  return whole_view() && it != splits_.end() ? unsplit_shape(e.shape, it->second, tensor_size_)
                                             : e.shape;
}

at::Tensor TagReader::module_tensor(const ModuleFile& f, const std::string& entry) {
  auto it = splits_.find(f.prefix + entry);
  if (!whole_view() || it == splits_.end()) return tensor(f.file, entry);
  // Slice t holds, of each of `parts` blocks along dim, the t-th of tensor_size_ equal pieces.
  const TensorSplit& split = it->second;
  std::vector<at::Tensor> slices;
  for (int t = 0; t < tensor_size_; ++t) {
    at::Tensor slice = tensor(model_states_file_name(t), entry);
    auto blocks = slice.sizes().vec();
    blocks[split.dim] /= split.parts;
    blocks.insert(blocks.begin() + split.dim, split.parts);
    slices.push_back(slice.reshape(blocks));
  }
  at::Tensor whole = at::cat(slices, split.dim + 1);
  auto shape = whole.sizes().vec();
  shape[split.dim] *= shape[split.dim + 1];
  shape.erase(shape.begin() + split.dim + 1);
  return whole.reshape(shape);
}

std::vector<int> TagReader::ranks_holding(const std::string& param, int64_t offset,
                                          int64_t numel) const {
  std::vector<int> out;
  const auto& pieces = pieces_.at(view_ < 0 ? 0 : view_);
  auto it = pieces.find(param);
  if (it == pieces.end()) return out;
  for (const auto& p : it->second)
    if (std::min(offset + numel, p.offset + p.numel) > std::max(offset, p.offset))
      out.push_back(p.rank);
  return out;
}

template <class Visit>
int64_t TagReader::for_each_piece_of(int t, const std::string& kind, const std::string& param,
                                     int64_t offset, int64_t numel, int64_t into, Visit&& visit) {
  auto it = pieces_.at(t).find(param);
  if (it == pieces_.at(t).end())
    throw CheckpointError("checkpoint '" + dir_ + "' has no state for parameter \"" + param + "\"" +
                          (tensor_size_ > 1 ? " of tensor-parallel rank " + std::to_string(t) : ""));
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
    visit(file_name, e, lo - p.offset, into + lo - offset, hi - lo);
    covered += hi - lo;
  }
  return covered;
}

template <class Visit>
void TagReader::for_each_piece(const std::string& kind, const std::string& param, int64_t offset,
                               int64_t numel, Visit&& visit) {
  int64_t covered = 0;
  auto split = splits_.find(param);
  if (!whole_view() || split == splits_.end()) {
    covered = for_each_piece_of(view_ < 0 ? 0 : view_, kind, param, offset, numel, 0, visit);
  } else {
    std::vector<int64_t> whole;
    for (const auto& t : trainable_)
      if (t.name == param) whole = t.shape;
    for_each_slice_run(whole, split->second, tensor_size_, offset, numel,
                       [&](int t, int64_t local, int64_t into, int64_t n) {
                         covered += for_each_piece_of(t, kind, param, local, n, into, visit);
                       });
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
