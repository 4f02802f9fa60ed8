#include "checkpoint/torch_save.h"

#include <caffe2/serialize/inline_container.h>

#include <cstring>
#include <set>

#include "checkpoint/state_dict_pickle.h"
#include "deepspeed/errors.h"

// The data records are the tensors' raw memory, and torch.load reads them as little-endian.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "torch.save output assumes a little-endian host");

namespace deepspeed {
namespace checkpoint {
namespace {

std::string named_tensor(const std::string& name) { return "tensor \"" + name + "\": "; }

const char* storage_class(const SafetensorsEntry& e) {
  if (const char* name = torch_storage_class(e.dtype)) return name;
  throw CheckpointError(named_tensor(e.name) + "dtype " + c10::toString(e.dtype) +
                        " cannot be stored in a torch.save file here");
}

// Pickle opcodes (Python's Lib/pickletools.py), protocol 2: no framing, no memo needed.
class Pickle {
 public:
  void proto2() { bytes_ += "\x80\x02"; }
  void global(const std::string& module, const std::string& name) {
    bytes_ += 'c' + module + '\n' + name + '\n';
  }
  void mark() { bytes_ += '('; }
  void tuple() { bytes_ += 't'; }  // everything since the mark
  void empty_tuple() { bytes_ += ')'; }
  void empty_dict() { bytes_ += '}'; }
  void reduce() { bytes_ += 'R'; }
  void setitems() { bytes_ += 'u'; }
  void binpersid() { bytes_ += 'Q'; }
  void new_false() { bytes_ += '\x89'; }
  void stop() { bytes_ += '.'; }
  void string(const std::string& s) {  // BINUNICODE: 4-byte little-endian length, UTF-8
    bytes_ += 'X';
    little_endian(s.size(), 4);
    bytes_ += s;
  }
  void integer(int64_t v) {
    if (v >= 0 && v < 256) {  // BININT1
      bytes_ += 'K';
      little_endian(uint64_t(v), 1);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {  // BININT: signed 4 bytes
      bytes_ += 'J';
      little_endian(uint64_t(uint32_t(int32_t(v))), 4);
    } else {  // LONG1: n bytes of two's complement, little-endian
      bytes_ += '\x8a';
      bytes_ += char(8);
      little_endian(uint64_t(v), 8);
    }
  }
  void int_tuple(const std::vector<int64_t>& values) {
    mark();
    for (int64_t v : values) integer(v);
    tuple();
  }
  std::string take() { return std::move(bytes_); }

 private:
  void little_endian(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) bytes_ += char((v >> (8 * i)) & 0xFF);
  }
  std::string bytes_;
};

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;)
    strides[i - 1] = strides[i] * std::max<int64_t>(shape[i], 1);
  return strides;
}

// Python's pickler batches SETITEMS by 1000 entries; unpicklers take any count, this matches it.
constexpr size_t kBatch = 1000;

// storage_of, checked, or every entry its own when empty.
StorageOwners checked_owners(const std::vector<SafetensorsEntry>& entries,
                             const StorageOwners& storage_of) {
  StorageOwners owners = storage_of;
  if (owners.empty())
    for (size_t i = 0; i < entries.size(); ++i) owners.push_back(i);
  if (owners.size() != entries.size())
    throw CheckpointError("storage owners given for " + std::to_string(owners.size()) + " of " +
                          std::to_string(entries.size()) + " tensors");
  for (size_t i = 0; i < entries.size(); ++i) {
    const size_t j = owners[i];
    if (j == i) continue;
    const SafetensorsEntry &e = entries[i], &owner = entries[std::min(j, i)];
    if (j > i || owners[j] != j || e.dtype != owner.dtype || e.shape != owner.shape)
      throw CheckpointError(named_tensor(e.name) + "cannot share the storage of entry " +
                            std::to_string(j) + (j < i ? " (\"" + owner.name + "\")" : "") +
                            ": an earlier tensor of its own storage, dtype and shape is needed");
  }
  return owners;
}

}  // namespace

std::string torch_save_pickle(const std::vector<SafetensorsEntry>& entries,
                              const StorageOwners& storage_of) {
  const StorageOwners owners = checked_owners(entries, storage_of);
  Pickle p;
  p.proto2();
  // A plain dict, as zero_to_fp32's shards (Python keeps its order): libtorch's reader
  // (torch::pickle_load) reads dicts, but turns an OrderedDict into None.
  p.empty_dict();
  std::set<std::string> seen;
  for (size_t i = 0; i < entries.size(); ++i) {
    const SafetensorsEntry& e = entries[i];
    if (!seen.insert(e.name).second)
      throw CheckpointError(named_tensor(e.name) + "name used twice");
    if (i % kBatch == 0) p.mark();
    p.string(e.name);
    p.global("torch._utils", "_rebuild_tensor_v2");
    p.mark();
    // persistent id: ('storage', torch.<Dtype>Storage, key, location, numel)
    p.mark();
    p.string("storage");
    p.global("torch", storage_class(e));
    p.string(std::to_string(owners[i]));
    p.string("cpu");
    p.integer(entries[owners[i]].numel());
    p.tuple();
    p.binpersid();
    p.integer(0);  // storage offset
    p.int_tuple(e.shape);
    p.int_tuple(contiguous_strides(e.shape));
    p.new_false();  // requires_grad
    p.global("collections", "OrderedDict");  // backward hooks: none
    p.empty_tuple();
    p.reduce();
    p.tuple();
    p.reduce();
    if (i % kBatch == kBatch - 1 || i + 1 == entries.size()) p.setitems();
  }
  p.stop();
  return p.take();
}

TorchSaveWriter::TorchSaveWriter(WritableFile& file, std::string path,
                                 std::vector<SafetensorsEntry> entries, StorageOwners storage_of)
    : file_(file), path_(std::move(path)), entries_(std::move(entries)) {
  std::string pickle;
  try {
    storage_of_ = checked_owners(entries_, storage_of);
    pickle = torch_save_pickle(entries_, storage_of_);
  } catch (const CheckpointError& e) {  // the file it was for, not only the tensor at fault
    throw CheckpointError("torch.save file '" + path_ + "': " + e.what());
  }
  archive_ = std::make_unique<caffe2::serialize::PyTorchStreamWriter>(
      std::function<size_t(const void*, size_t)>(
          [this](const void* data, size_t n) { return write(data, n); }));
  archive_->writeRecord("data.pkl", pickle.data(), pickle.size());
  rethrow_write_error();
  static const char kByteOrder[] = "little";
  archive_->writeRecord("byteorder", kByteOrder, std::strlen(kByteOrder));
  rethrow_write_error();
}

TorchSaveWriter::~TorchSaveWriter() {
  // Left unfinished (an exception on the way): PyTorchStreamWriter's destructor would close the
  // archive and could throw from there; close it here with writes dropped, and keep quiet.
  if (archive_ && !archive_->finalized()) {
    if (!write_error_) write_error_ = std::make_exception_ptr(IOError("abandoned"));
    try {
      archive_->writeEndOfFile();
    } catch (...) {
    }
  }
}

size_t TorchSaveWriter::write(const void* data, size_t n) {
  if (write_error_) return n;
  try {
    file_.append(data, n);
  } catch (...) {
    write_error_ = std::current_exception();
  }
  return n;
}

void TorchSaveWriter::rethrow_write_error() {
  if (write_error_) std::rethrow_exception(write_error_);
}

void TorchSaveWriter::append(const at::Tensor& tensor) {
  const std::string where = "torch.save file '" + path_ + "': ";
  if (next_ == entries_.size())
    throw CheckpointError(where + "a tensor written past the last of its " +
                          std::to_string(entries_.size()));
  const SafetensorsEntry& e = entries_[next_];
  if (tensor.scalar_type() != e.dtype || tensor.sizes().vec() != e.shape)
    throw CheckpointError(where + named_tensor(e.name) + "got " +
                          c10::toString(tensor.scalar_type()) + " of shape " +
                          c10::str(tensor.sizes()) + " for an entry of " + c10::toString(e.dtype) +
                          " of shape " + c10::str(at::IntArrayRef(e.shape)) +
                          " (a torch.save record holds a tensor whole)");
  if (storage_of_[next_] != next_) {  // its bytes are the owner's record
    ++next_;
    return;
  }
  const at::Tensor host = tensor.detach().to(at::kCPU).contiguous();
  static const char kNothing = 0;  // a zero-size record still needs an address
  archive_->writeRecord("data/" + std::to_string(next_),
                        host.numel() > 0 ? host.data_ptr() : &kNothing, host.nbytes());
  rethrow_write_error();
  ++next_;
}

void TorchSaveWriter::finish() {
  if (next_ != entries_.size())
    throw CheckpointError("torch.save file '" + path_ + "': " + named_tensor(entries_[next_].name) +
                          "never written (" + std::to_string(next_) + " of " +
                          std::to_string(entries_.size()) + " tensors came)");
  archive_->writeEndOfFile();
  rethrow_write_error();
}

void write_torch_save_streamed(FileSystem& fs, const std::string& path,
                               const std::vector<SafetensorsEntry>& entries,
                               const std::function<void(TorchSaveWriter&)>& fill,
                               const StorageOwners& storage_of) {
  fs.write_file_atomic(path, [&](WritableFile& f) {
    TorchSaveWriter writer(f, path, entries, storage_of);
    fill(writer);
    writer.finish();
  });
}

void write_torch_save(FileSystem& fs, const std::string& path, const NamedTensors& tensors) {
  std::vector<SafetensorsEntry> entries;
  for (const auto& [name, t] : tensors) {
    if (!t.defined())
      throw CheckpointError("torch.save file '" + path + "': " + named_tensor(name) +
                            "is undefined");
    entries.push_back({name, t.scalar_type(), t.sizes().vec()});
  }
  write_torch_save_streamed(fs, path, entries, [&](TorchSaveWriter& w) {
    for (const auto& [name, t] : tensors) w.append(t);
  });
}

}  // namespace checkpoint
}  // namespace deepspeed
