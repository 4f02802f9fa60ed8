#include "checkpoint/tag_reader.h"

#include <sys/resource.h>

#include <algorithm>
#include <cctype>
#include <set>

#include "checkpoint/layout.h"
#include "checkpoint/tag_replacement.h"
#include "deepspeed/errors.h"

namespace deepspeed {
namespace checkpoint {

namespace {

// A file of Python DeepSpeed's layout in `dir` (its engine's "*_model_states.pt" or
// "*_optim_states.pt"), or "" when there is none.
std::string python_deepspeed_file(FileSystem& fs, const std::string& dir) {
  const auto ends_with = [](const std::string& name, const std::string& end) {
    return name.size() >= end.size() && name.compare(name.size() - end.size(), end.size(), end) == 0;
  };
  for (const auto& name : fs.list_dir(dir))
    if (ends_with(name, "_model_states.pt") || ends_with(name, "_optim_states.pt")) return name;
  return "";
}

}  // namespace

TagReader::TagReader(FileSystem& fs, const std::string& tag_dir)
    : fs_(fs), dir_(tag_dir_to_read(fs, tag_dir)) {
  struct rlimit files {};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY)
    max_open_ = std::clamp<size_t>(files.rlim_cur / 4, 1, kMaxOpenFiles);
  const std::string manifest_path = join_path(dir_, kManifestFileName);
  if (!fs_.exists(dir_)) throw CheckpointError("checkpoint folder '" + dir_ + "' does not exist");
  if (!fs_.exists(manifest_path)) {
    const std::string pickle = python_deepspeed_file(fs_, dir_);
    if (!pickle.empty())
      throw CheckpointError("checkpoint '" + dir_ + "' was written by Python DeepSpeed ('" +
                            pickle + "' is a torch.save pickle), which this library does not "
                            "read; export its weights to safetensors to load them into the model");
    throw CheckpointError("checkpoint '" + dir_ + "' is incomplete: '" + manifest_path +
                          "' is missing (the save did not finish)");
  }
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
                                  t.at("shape").get<std::vector<int64_t>>(),
                                  t.at("numel").get<int64_t>()});
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
      if (const TensorSplit* split = saved_split(t.name)) {
        t.shape = unsplit_shape(t.shape, *split, tensor_size_);
        t.numel *= tensor_size_;
      }
      unsplit_shapes_[t.name] = t.shape;
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
      if (t < 0 || t >= tensor_size_)
        bad("partition " + std::to_string(r) + " has tensor_rank " + std::to_string(t));
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
  OpenFile& out = files_.emplace(name, std::move(f)).first->second;
  mark_open(name, out);
  return out;
}

ReadableFile& TagReader::readable(const std::string& name) {
  OpenFile& f = open(name);
  if (f.file) {
    recent_.splice(recent_.begin(), recent_, f.recent);
    return *f.file;
  }
  // Verified when first opened: a file since replaced by one of another size reads as an error
  // naming it rather than as other bytes (the checksum is not read again).
  const std::string path = join_path(dir_, name);
  f.file = fs_.open_file(path);
  const uint64_t want = manifest_.files.at(name).bytes, got = f.file->size();
  if (got != want) {
    f.file.reset();
    throw CheckpointError("checkpoint file '" + path + "' has " + std::to_string(got) +
                          " bytes, expected " + std::to_string(want) + " (changed while read)");
  }
  mark_open(name, f);
  return *f.file;
}

void TagReader::mark_open(const std::string& name, OpenFile& f) {
  recent_.push_front(name);
  f.recent = recent_.begin();
  while (recent_.size() > max_open_) {
    files_.at(recent_.back()).file.reset();
    recent_.pop_back();
  }
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
  const SafetensorsIndex& index = open(name).index;
  ReadableFile& file = readable(name);
  if (dst.scalar_type() == e.dtype) {
    read_safetensors_range(file, join_path(dir_, name), index, e, 0, dst);
    return;
  }
  at::Tensor saved = at::empty({e.numel()}, at::TensorOptions().dtype(e.dtype));  // converted below
  read_safetensors_range(file, join_path(dir_, name), index, e, 0, saved);
  dst.copy_(saved.view(dst.sizes()));
}

const TensorSplit* TagReader::saved_split(const std::string& name) const {
  auto it = splits_.find(name);
  return tensor_size_ > 1 && it != splits_.end() ? &it->second : nullptr;
}

const TensorSplit* TagReader::view_split(const std::string& name) const {
  if (view_ < 0) return nullptr;
  if (own_view()) return saved_split(name);
  auto it = view_splits_.find(name);
  return it != view_splits_.end() ? &it->second : nullptr;
}

namespace {
std::string split_str(const TensorSplit* s) {
  return s ? "dim " + std::to_string(s->dim) + " in " + std::to_string(s->parts) + " block(s)"
           : "not split";
}
}  // namespace

void TagReader::view_as_tensor_rank(int size, int t,
                                    const std::map<std::string, TensorSplit>& model_splits,
                                    const std::set<std::string>* model_params) {
  if (size < 1 || t < 0 || t >= size)
    throw CheckpointError("checkpoint '" + dir_ + "': no tensor-parallel rank " +
                          std::to_string(t) + " in a group of " + std::to_string(size));
  view_ = t;
  view_size_ = size;
  if (own_view()) {
    trainable_ = slice_trainable_;
    if (tensor_size_ > 1) {
      for (auto& f : module_files_) f.file = tensor_rank_file(f, t);
      engine_file_ = model_states_file_name(t);  // a pipeline's: stage 0's of tensor rank t
    }
    return;
  }
  view_splits_ = model_splits;
  // A parameter both sides split must be cut the same way (another dim would be another
  // architecture's layout); at size 1 every parameter is whole, whatever the model's layers.
  std::set<std::string> names;
  for (const auto& [name, split] : splits_) names.insert(name);
  for (const auto& [name, split] : model_splits) names.insert(name);
  if (size == 1) view_splits_.clear();
  if (tensor_size_ > 1 && size > 1)
    for (const auto& name : names) {
      if (model_params && !model_params->count(name)) continue;  // another pipeline stage's
      const TensorSplit* saved = saved_split(name);
      auto it = model_splits.find(name);
      const TensorSplit* mine = it != model_splits.end() ? &it->second : nullptr;
      if (!saved || !mine || saved->dim != mine->dim || saved->parts != mine->parts)
        throw CheckpointError(
            "checkpoint '" + dir_ + "': parameter \"" + name + "\" was saved " + split_str(saved) +
            " over tensor-parallel size " + std::to_string(tensor_size_) + ", the model cuts it " +
            split_str(mine) + ": it cannot be resharded to size " + std::to_string(size));
    }
  trainable_.clear();
  for (const auto& t0 : slice_trainable_) {
    TrainableInfo info{t0.name, unsplit_shapes_.at(t0.name), 0};
    if (const TensorSplit* split = view_split(info.name)) {
      const int64_t dim = info.shape.at(split->dim);
      if (dim % (int64_t{split->parts} * size) != 0)
        throw CheckpointError("checkpoint '" + dir_ + "' (saved at tensor-parallel size " +
                              std::to_string(tensor_size_) + ", pipeline stages " +
                              std::to_string(pipeline_stages_) + "): parameter \"" + info.name +
                              "\" has " + std::to_string(dim) + " along dim " +
                              std::to_string(split->dim) + " in " + std::to_string(split->parts) +
                              " block(s), which tensor-parallel size " + std::to_string(size) +
                              " does not divide");
      info.shape[split->dim] /= size;
    }
    info.numel = 1;
    for (int64_t d : info.shape) info.numel *= d;
    trainable_.push_back(info);
  }
}

std::vector<int64_t> TagReader::module_tensor_shape(const ModuleFile& f,
                                                    const SafetensorsEntry& e) const {
  if (own_view()) return e.shape;
  std::vector<int64_t> shape = e.shape;
  if (const TensorSplit* saved = saved_split(f.prefix + e.name))
    shape = unsplit_shape(shape, *saved, tensor_size_);
  if (const TensorSplit* split = view_split(f.prefix + e.name)) shape.at(split->dim) /= view_size_;
  return shape;
}

at::Tensor TagReader::module_tensor(const ModuleFile& f, const std::string& entry) {
  const TensorSplit* split = saved_split(f.prefix + entry);
  if (!split) return tensor(f.file, entry);
  // Slice t holds, of each of `parts` blocks along dim, the t-th of tensor_size_ equal pieces.
  std::vector<at::Tensor> slices;
  for (int t = 0; t < tensor_size_; ++t) {
    at::Tensor slice = tensor(tensor_rank_file(f, t), entry);
    auto blocks = slice.sizes().vec();
    blocks[split->dim] /= split->parts;
    blocks.insert(blocks.begin() + split->dim, split->parts);
    slices.push_back(slice.reshape(blocks));
  }
  at::Tensor whole = at::cat(slices, split->dim + 1);
  auto shape = whole.sizes().vec();
  shape[split->dim] *= shape[split->dim + 1];
  shape.erase(shape.begin() + split->dim + 1);
  return whole.reshape(shape);
}

void TagReader::check_module_tensor_sources(const ModuleFile& f, const std::string& entry) {
  if (own_view() || !saved_split(f.prefix + entry)) {
    this->entry(f.file, entry);  // read from this one file (whole, or re-cut in memory)
    return;
  }
  for (int t = 0; t < tensor_size_; ++t) this->entry(tensor_rank_file(f, t), entry);
}

void TagReader::read_module_tensor(const ModuleFile& f, const std::string& entry, at::Tensor dst) {
  const std::string name = f.prefix + entry;
  if (own_view() || (!saved_split(name) && !view_split(name)))
    return read_tensor(f.file, entry, dst);
  at::Tensor whole = module_tensor(f, entry);
  if (const TensorSplit* split = view_split(name)) {  // rank view_'s piece of every block
    auto blocks = whole.sizes().vec();
    blocks[split->dim] /= split->parts;
    blocks.insert(blocks.begin() + split->dim, split->parts);
    const int64_t per_rank = blocks[split->dim + 1] / view_size_;
    whole = whole.reshape(blocks).narrow(split->dim + 1, view_ * per_rank, per_rank);
  }
  if (whole.numel() != dst.numel())
    throw CheckpointError("checkpoint file '" + join_path(dir_, f.file) + "': tensor \"" + entry +
                          "\" has " + std::to_string(whole.numel()) +
                          " elements in this view, read into " + std::to_string(dst.numel()));
  dst.copy_(whole.reshape(dst.sizes()));
}

std::vector<int> TagReader::ranks_holding(const std::string& param, int64_t offset,
                                          int64_t numel) const {
  std::vector<int> out;
  const auto& pieces = pieces_.at(own_view() ? view_ : 0);
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
  // Nothing to read, and nothing saved: a zero-element parameter has no fragment on any rank
  // (partition_fragments writes none for it).
  if (numel == 0) return 0;
  auto it = pieces_.at(t).find(param);
  if (it == pieces_.at(t).end())
    throw CheckpointError(
        "checkpoint '" + dir_ + "' has no state for parameter \"" + param + "\"" +
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

// The view's range -> ranges of the unsplit tensor (resharding: through the model's cut) ->
// runs in the saved slices (through the saved cut) -> the saved fragments.
template <class Visit>
void TagReader::for_each_piece(const std::string& kind, const std::string& param, int64_t offset,
                               int64_t numel, Visit&& visit) {
  int64_t covered = 0;
  if (own_view()) {
    covered = for_each_piece_of(view_, kind, param, offset, numel, 0, visit);
  } else {
    auto shape = unsplit_shapes_.find(param);
    if (shape == unsplit_shapes_.end())
      throw CheckpointError("checkpoint '" + dir_ + "' has no state for parameter \"" + param +
                            "\"");
    const TensorSplit* saved = saved_split(param);
    auto unsplit_range = [&](int64_t begin, int64_t n, int64_t into) {
      if (!saved) {
        covered += for_each_piece_of(0, kind, param, begin, n, into, visit);
        return;
      }
      for_each_slice_run(shape->second, *saved, tensor_size_, begin, n,
                         [&](int t, int64_t local, int64_t at, int64_t m) {
                           covered += for_each_piece_of(t, kind, param, local, m, into + at, visit);
                         });
    };
    if (const TensorSplit* split = view_split(param))
      for_each_unsplit_run(
          shape->second, *split, view_size_, view_, offset, numel,
          [&](int64_t begin, int64_t into, int64_t n) { unsplit_range(begin, n, into); });
    else
      unsplit_range(offset, numel, 0);
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
        const SafetensorsIndex& index = open(file_name).index;
        ReadableFile& file = readable(file_name);
        at::Tensor part = dst.narrow(0, into, n);
        if (part.scalar_type() == at::kFloat) {
          read_safetensors_range(file, join_path(dir_, file_name), index, e, from, part);
        } else {
          at::Tensor tmp = at::empty({n}, at::kFloat);
          read_safetensors_range(file, join_path(dir_, file_name), index, e, from, tmp);
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
  // Trimmed at both ends, as DeepSpeed's strip(): a `latest` written by hand or another tool may
  // carry a leading space or newline too.
  const auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!tag.empty() && space(tag.back())) tag.pop_back();
  tag.erase(tag.begin(), std::find_if_not(tag.begin(), tag.end(), space));
  if (tag.empty()) throw CheckpointError("'" + path + "' is empty: it should name a checkpoint tag");
  return tag;
}

}  // namespace checkpoint
}  // namespace deepspeed
