#include "tp/shard_loader.h"

#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <utility>

#include "checkpoint/consolidate.h"
#include "checkpoint/file_system.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/tag_reader.h"
#include "checkpoint/torch_load.h"
#include "checkpoint/weights_folder.h"
#include "deepspeed/errors.h"
#include "util/text.h"

namespace deepspeed {
namespace tp {
namespace {

using checkpoint::posix_file_system;

// A training checkpoint: trainable parameters from the fp32 fragments of whichever ranks saved
// them; anything else (buffers, frozen parameters) from the module files, read whole once (they
// are small: masks, counters) and sliced in memory. A tensor-parallel training checkpoint reads
// as the unsplit model (TagReader's default view): ranges of a split parameter are assembled from
// the saved slices, so any tp_size reads it.
class CheckpointSource : public WeightSource {
 public:
  CheckpointSource(const std::string& path, const std::string& tag)
      : dir_(checkpoint::resolve_tag_dir(posix_file_system(), path, tag)),
        reader_(posix_file_system(), dir_) {
    for (const auto& t : reader_.trainable()) trainable_[t.name] = t.shape;
    for (const auto& mf : reader_.module_files())
      for (const auto& e : reader_.file(mf.file).entries)
        if (!trainable_.count(mf.prefix + e.name))
          others_[mf.prefix + e.name] = {mf, e.name, reader_.module_tensor_shape(mf, e),
                                         at::Tensor()};
  }
  std::optional<std::vector<int64_t>> shape(const std::string& name) override {
    if (auto it = trainable_.find(name); it != trainable_.end()) return it->second;
    if (auto it = others_.find(name); it != others_.end()) return it->second.shape;
    return std::nullopt;
  }
  void read(const std::string& name, int64_t offset, at::Tensor dst) override {
    if (trainable_.count(name)) return reader_.read_range("fp32", name, offset, dst);
    Other& o = others_.at(name);
    if (!o.whole.defined()) o.whole = reader_.module_tensor(o.file, o.entry).reshape({-1});
    dst.copy_(o.whole.narrow(0, offset, dst.numel()));
  }
  const std::string& path() const override { return reader_.dir(); }

 private:
  struct Other {
    checkpoint::ModuleFile file;
    std::string entry;
    std::vector<int64_t> shape;
    at::Tensor whole;
  };
  std::string dir_;
  checkpoint::TagReader reader_;
  std::map<std::string, std::vector<int64_t>> trainable_;
  std::map<std::string, Other> others_;
};

// A weights file (ds_to_fp32's or save_16bit_model's output, or PyTorch's): ranges read straight
// from the file, converted when the caller's dtype differs. `Format` gives the file's index and
// its range read (below).
template <typename Format>
class WeightsFileSource : public WeightSource {
 public:
  explicit WeightsFileSource(const std::string& path)
      : path_(path),
        file_(posix_file_system().open_file(path)),
        index_(Format::read_index(*file_, path)) {}
  std::optional<std::vector<int64_t>> shape(const std::string& name) override {
    if (const auto* e = index_.find(name)) return e->shape;
    return std::nullopt;
  }
  void read(const std::string& name, int64_t offset, at::Tensor dst) override {
    const auto* e = index_.find(name);
    if constexpr (Format::may_have_strides) {
      // A view stored with strides (a transposed weight of a Python state dict) has no ranges in
      // place: it is read whole once, row-major, and its ranges copied from there.
      if (!e->contiguous()) {
        auto& whole = strided_[name];
        if (!whole.defined())
          whole = Format::read_tensor(*file_, path_, index_, *e).reshape({-1});
        dst.copy_(whole.narrow(0, offset, dst.numel()).view(dst.sizes()));
        return;
      }
    }
    if (e->dtype == dst.scalar_type())
      return Format::read_range(*file_, path_, index_, *e, offset, dst);
    at::Tensor tmp = at::empty({dst.numel()}, dst.options().dtype(e->dtype));
    Format::read_range(*file_, path_, index_, *e, offset, tmp);
    dst.copy_(tmp.view(dst.sizes()));
  }
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  std::unique_ptr<checkpoint::ReadableFile> file_;
  decltype(Format::read_index(std::declval<checkpoint::ReadableFile&>(), "")) index_;
  std::map<std::string, at::Tensor> strided_;  // whole copies of the tensors stored with strides
};

struct SafetensorsFormat {
  static constexpr bool may_have_strides = false;  // always row-major
  static constexpr auto read_index = &checkpoint::read_safetensors_index;
  static constexpr auto read_range = &checkpoint::read_safetensors_range;
};
// A torch.save state dict: its pickle read without running code, ranges from its zip records.
struct TorchSaveFormat {
  static constexpr bool may_have_strides = true;
  static constexpr auto read_index = &checkpoint::read_torch_save_index;
  static constexpr auto read_range = &checkpoint::read_torch_save_range;
  static constexpr auto read_tensor = &checkpoint::read_torch_save_tensor;
};

std::unique_ptr<WeightSource> open_weights_file(const std::string& path) {
  if (ends_with(path, ".safetensors"))
    return std::make_unique<WeightsFileSource<SafetensorsFormat>>(path);
  return std::make_unique<WeightsFileSource<TorchSaveFormat>>(path);
}

// A model folder split into shards (ds_to_fp32's with --max_shard_size, or Hugging Face's): the
// index's weight_map says which file holds each tensor; a file is opened when first read.
class ShardedFolderSource : public WeightSource {
 public:
  explicit ShardedFolderSource(checkpoint::WeightsFolder folder) : folder_(std::move(folder)) {}
  std::optional<std::vector<int64_t>> shape(const std::string& name) override {
    auto it = folder_.file_of.find(name);
    if (it == folder_.file_of.end()) return std::nullopt;
    auto shape = source(it->second).shape(name);
    if (!shape)
      throw CheckpointError("init_inference: index '" + folder_.index_path + "' puts tensor \"" +
                            name + "\" in '" + it->second + "', which does not hold it");
    return shape;
  }
  void read(const std::string& name, int64_t offset, at::Tensor dst) override {
    source(folder_.file_of.at(name)).read(name, offset, dst);
  }
  const std::string& path() const override { return folder_.index_path; }

 private:
  WeightSource& source(const std::string& file) {
    auto& s = open_[file];
    if (!s) {
      if (!posix_file_system().exists(file))
        throw CheckpointError("init_inference: shard '" + file + "' named by index '" +
                              folder_.index_path + "' does not exist");
      s = open_weights_file(file);
    }
    return *s;
  }
  checkpoint::WeightsFolder folder_;
  std::map<std::string, std::unique_ptr<WeightSource>> open_;
};

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

}  // namespace

std::unique_ptr<WeightSource> open_weights(const std::string& path, const std::string& tag) {
  if (ends_with(path, ".safetensors")) {
    if (!posix_file_system().exists(path))
      throw CheckpointError("init_inference: weights file '" + path + "' does not exist");
    return std::make_unique<WeightsFileSource<SafetensorsFormat>>(path);
  }
  // A sharded folder's index named itself.
  if (ends_with(path, ".index.json"))
    return std::make_unique<ShardedFolderSource>(
        checkpoint::read_weights_index(posix_file_system(), path));
  // Any other file: a torch.save state dict (save_16bit_model's and ds_to_fp32's default); one
  // that is not is named by the reader.
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec)) return open_weights_file(path);
  // A folder without a checkpoint's `latest` or manifest but with ds_to_fp32's output (or a
  // Hugging Face model's weights).
  auto& fs = posix_file_system();
  if (tag.empty() && std::filesystem::is_directory(path, ec) &&
      !checkpoint::holds_checkpoint(fs, path)) {
    if (auto folder = checkpoint::find_weights_folder(fs, path)) {
      if (folder->index_path.empty()) return open_weights_file(folder->files.front());
      return std::make_unique<ShardedFolderSource>(std::move(*folder));
    }
    throw CheckpointError("init_inference: " + checkpoint::neither_weights_nor_checkpoint(path));
  }
  return std::make_unique<CheckpointSource>(path, tag);
}

at::Tensor read_whole(WeightSource& src, const std::string& name, const std::vector<int64_t>& shape,
                      at::ScalarType dtype) {
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(dtype));
  src.read(name, 0, out.view({-1}));
  return out;
}

at::Tensor read_rows(WeightSource& src, const std::string& name, const std::vector<int64_t>& shape,
                     int parts, Range r) {
  const int64_t per_part = shape[0] / parts, row = numel_of(shape) / shape[0];
  auto out_shape = shape;
  out_shape[0] = parts * r.size();
  at::Tensor out = at::empty(out_shape, at::kFloat);
  at::Tensor flat = out.view({parts, r.size() * row});
  for (int p = 0; p < parts; ++p)  // one contiguous range per part
    src.read(name, (p * per_part + r.begin) * row, flat[p]);
  return out;
}

at::Tensor read_columns(WeightSource& src, const std::string& name,
                        const std::vector<int64_t>& shape, Range r) {
  const int64_t rows = shape[0], cols = shape[1];
  at::Tensor out = at::empty({rows, r.size()}, at::kFloat);
  for (int64_t i = 0; i < rows; ++i) src.read(name, i * cols + r.begin, out[i]);
  return out;
}

}  // namespace tp
}  // namespace deepspeed
