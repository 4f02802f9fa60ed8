// torch.save files of a state dict (what DeepSpeed's save_16bit_model and zero_to_fp32 write as
// pytorch_model.bin), written without Python: PyTorch's zip archive (caffe2's
// PyTorchStreamWriter, records aligned for mmap) holding
//   archive/data.pkl      a protocol-2 pickle of a dict {name: tensor} in entry order (plain, as
//                         zero_to_fp32's shards: libtorch's reader takes no OrderedDict), each
//                         tensor as torch._utils._rebuild_tensor_v2(persistent storage i, offset
//                         0, shape, contiguous strides, requires_grad False, OrderedDict())
//   archive/byteorder     "little" (torch 2.x writes it; 1.13 ignores it)
//   archive/data/<i>      tensor i's bytes
//   archive/version       written by PyTorchStreamWriter
// The pickle uses only the globals torch.load(weights_only=True) allows: collections.OrderedDict,
// torch._utils._rebuild_tensor_v2 and torch.<Float|BFloat16|Half|...>Storage. Read by Python's
// torch.load and libtorch's torch::pickle_load. Tensors are whole (one record each); a file holds
// one tensor's bytes in memory at a time besides the pickle.
// Thread-safety: free functions, no shared state; a TorchSaveWriter is used by one thread.
#pragma once
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/file_system.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/tensor_sink.h"

namespace caffe2 {
namespace serialize {
class PyTorchStreamWriter;
}  // namespace serialize
}  // namespace caffe2

namespace deepspeed {
namespace checkpoint {

// Which entry's storage holds each entry's bytes: storage_of[i] == i for its own, or an earlier
// entry j (storage_of[j] == j, same dtype and shape) whose storage it shares, as a tied
// parameter's second name does: that storage is written once and torch.load gives both names one
// memory, as torch.save does for tensors that share it. Empty: every entry has its own.
using StorageOwners = std::vector<size_t>;

// The data.pkl bytes for tensors described by (name, dtype, shape), entry i in storage key
// "<storage_of[i]>" ("0", "1", ... when none is shared): exposed so tests can check them. Throws
// CheckpointError naming a tensor whose dtype torch.save has no storage class for here, a name
// used twice, or a storage shared with a later entry or one of another dtype or shape.
std::string torch_save_pickle(const std::vector<SafetensorsEntry>& entries,
                              const StorageOwners& storage_of = {});

// Receives the tensors of a file whose pickle is already written, whole and in entry order.
class TorchSaveWriter final : public TensorSink {
 public:
  TorchSaveWriter(WritableFile& file, std::string path, std::vector<SafetensorsEntry> entries,
                  StorageOwners storage_of = {});
  ~TorchSaveWriter() override;
  // The next tensor, whole, of its entry's dtype and shape (any device; copied to the host when
  // needed). CheckpointError naming the file and tensor otherwise; IOError from the file. An
  // entry sharing an earlier one's storage writes nothing (its tensor is checked, not compared).
  void append(const at::Tensor& tensor) override;
  // Every tensor came: closes the archive (its central directory). CheckpointError naming the
  // first missing tensor otherwise.
  void finish();

 private:
  size_t write(const void* data, size_t n);  // the archive's output, through file_
  void rethrow_write_error();
  WritableFile& file_;
  std::string path_;
  std::vector<SafetensorsEntry> entries_;
  StorageOwners storage_of_;
  size_t next_ = 0;
  // miniz must never see a short write or an exception: a failure is kept here, later writes are
  // dropped, and the error is rethrown once the archive call returns.
  std::exception_ptr write_error_;
  std::unique_ptr<caffe2::serialize::PyTorchStreamWriter> archive_;
};

// Writes atomically a file holding `entries`, whose tensors `fill` appends in order. IOError for
// I/O failures, CheckpointError for names, dtypes or data that do not match the entries.
void write_torch_save_streamed(FileSystem& fs, const std::string& path,
                               const std::vector<SafetensorsEntry>& entries,
                               const std::function<void(TorchSaveWriter&)>& fill,
                               const StorageOwners& storage_of = {});
// The same for tensors in memory (any device, any layout).
void write_torch_save(FileSystem& fs, const std::string& path, const NamedTensors& tensors);

}  // namespace checkpoint
}  // namespace deepspeed
