#include "checkpoint/torch_load.h"

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>

#include "deepspeed/errors.h"

// The records are the tensors' little-endian memory.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "torch.save input assumes a little-endian host");

namespace deepspeed {
namespace checkpoint {
namespace {

// PyTorchStreamReader reads through our file (so tests' fault injection reaches it).
class FileAdapter final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit FileAdapter(ReadableFile& file) : file_(file), size_(file.size()) {}
  size_t size() const override { return size_; }
  size_t read(uint64_t pos, void* buf, size_t n, const char*) const override {
    if (pos >= size_) return 0;
    n = std::min<uint64_t>(n, size_ - pos);
    file_.read_at(pos, buf, n);
    return n;
  }

 private:
  ReadableFile& file_;
  uint64_t size_;
};

std::string torch_file(const std::string& path) { return "torch.save file '" + path + "': "; }

}  // namespace

const PickledTensor* TorchSaveIndex::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

TorchSaveIndex read_torch_save_index(ReadableFile& file, const std::string& path) {
  char magic[4] = {0, 0, 0, 0};
  if (file.size() >= 4) file.read_at(0, magic, 4);
  if (std::string(magic, 4) != std::string("PK\x03\x04", 4))
    throw CheckpointError(torch_file(path) +
                          "not a zip archive: not a torch.save file, or one of the legacy format "
                          "(torch < 1.6, or _use_new_zipfile_serialization=False); load and save "
                          "it again with a newer torch");
  TorchSaveIndex index;
  std::string pickle;
  try {
    caffe2::serialize::PyTorchStreamReader reader(std::make_shared<FileAdapter>(file));
    if (reader.hasRecord("byteorder")) {
      auto [order, n] = reader.getRecord("byteorder");
      const std::string byteorder(static_cast<const char*>(order.get()), n);
      if (byteorder != "little")
        throw CheckpointError(torch_file(path) + "written with byte order \"" + byteorder +
                              "\"; only little-endian files are read here");
    }
    auto [data, size] = reader.getRecord("data.pkl");
    pickle.assign(static_cast<const char*>(data.get()), size);
    index.tensors = read_state_dict_pickle(pickle, path);
    for (const auto& t : index.tensors) {
      if (index.storage_offsets.count(t.storage_key)) continue;
      const std::string record = "data/" + t.storage_key;
      if (!reader.hasRecord(record))
        throw CheckpointError(torch_file(path) + "tensor \"" + t.name + "\": its record " +
                              record + " is missing");
      index.storage_offsets[t.storage_key] = reader.getRecordOffset(record);
    }
  } catch (const c10::Error& e) {
    throw CheckpointError(torch_file(path) + "unreadable archive: " + e.what_without_backtrace());
  }
  for (const auto& t : index.tensors) {
    const uint64_t bytes = uint64_t(t.storage_numel) * c10::elementSize(t.dtype);
    const uint64_t begin = index.storage_offsets.at(t.storage_key);
    if (begin > file.size() || bytes > file.size() - begin)
      throw CheckpointError(torch_file(path) + "tensor \"" + t.name + "\": its storage of " +
                            std::to_string(bytes) + " bytes runs past the end of the file: the "
                            "file is truncated");
    int64_t last = t.storage_offset;  // the highest element the strides reach
    for (size_t d = 0; d < t.shape.size(); ++d)
      if (t.shape[d] > 0) last += (t.shape[d] - 1) * t.stride[d];
    if (t.storage_offset < 0 || (t.numel() > 0 && last >= t.storage_numel))
      throw CheckpointError(torch_file(path) + "tensor \"" + t.name + "\" reaches past its " +
                            "storage of " + std::to_string(t.storage_numel) + " elements");
  }
  return index;
}

void read_torch_save_range(ReadableFile& file, const std::string& path,
                           const TorchSaveIndex& index, const PickledTensor& t, int64_t offset,
                           at::Tensor dst) {
  const std::string where = torch_file(path) + "tensor \"" + t.name + "\": ";
  const int64_t numel = dst.numel();
  if (dst.scalar_type() != t.dtype)
    throw CheckpointError(where + "read into a " + c10::toString(dst.scalar_type()) +
                          " tensor, the file holds " + c10::toString(t.dtype));
  if (offset < 0 || offset + numel > t.numel())
    throw CheckpointError(where + "elements [" + std::to_string(offset) + ", " +
                          std::to_string(offset + numel) + ") are outside its " +
                          std::to_string(t.numel()));
  if (numel == 0) return;
  if (!t.contiguous())
    throw CheckpointError(where + "stored with strides " + c10::str(at::IntArrayRef(t.stride)) +
                          " for shape " + c10::str(at::IntArrayRef(t.shape)) +
                          ", not row-major: its ranges cannot be read in place");
  at::Tensor into = dst.is_contiguous() && dst.is_cpu()
                        ? dst
                        : at::empty({numel}, dst.options().device(at::kCPU));
  const uint64_t element = c10::elementSize(t.dtype);
  try {
    file.read_at(index.storage_offsets.at(t.storage_key) +
                     uint64_t(t.storage_offset + offset) * element,
                 into.data_ptr(), uint64_t(numel) * element);
  } catch (const IOError& err) {
    throw CheckpointError(where + err.what());
  }
  if (!into.is_same(dst)) dst.copy_(into.view(dst.sizes()));
}

at::Tensor read_torch_save_tensor(ReadableFile& file, const std::string& path,
                                  const TorchSaveIndex& index, const PickledTensor& t) {
  if (t.contiguous() || t.numel() == 0) {
    at::Tensor whole = at::empty(t.shape, at::TensorOptions().dtype(t.dtype));
    read_torch_save_range(file, path, index, t, 0, whole.view({-1}));
    return whole;
  }
  // The storage's span it reaches, then the view copied out.
  int64_t span = 1;
  for (size_t d = 0; d < t.shape.size(); ++d) span += (t.shape[d] - 1) * t.stride[d];
  at::Tensor storage = at::empty({span}, at::TensorOptions().dtype(t.dtype));
  PickledTensor flat = t;
  flat.shape = {span};
  flat.stride = {1};
  read_torch_save_range(file, path, index, flat, 0, storage);
  return storage.as_strided(t.shape, t.stride).contiguous();
}

NamedTensors read_torch_save(FileSystem& fs, const std::string& path) {
  if (!fs.exists(path)) throw CheckpointError(torch_file(path) + "does not exist");
  auto file = fs.open_file(path);
  const TorchSaveIndex index = read_torch_save_index(*file, path);
  NamedTensors out;
  for (const auto& t : index.tensors)
    out.emplace_back(t.name, read_torch_save_tensor(*file, path, index, t));
  return out;
}

}  // namespace checkpoint
}  // namespace deepspeed
