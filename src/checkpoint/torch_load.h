// Reading torch.save state dicts (pytorch_model.bin from save_16bit_model, ds_to_fp32, DeepSpeed or
// Hugging Face) without Python: the pickle through the restricted reader of state_dict_pickle.h
// (no code runs), the tensors' bytes straight from their stored zip records, any range of a
// tensor at a time (so a rank reads only its slices). PyTorch's zip format only (torch >= 1.6's
// default); the legacy format is refused naming the file.
// Thread-safety: free functions; an index is read-only once built.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "checkpoint/file_system.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/state_dict_pickle.h"

namespace deepspeed {
namespace checkpoint {

struct TorchSaveIndex {
  std::vector<PickledTensor> tensors;               // in the file's order
  std::map<std::string, uint64_t> storage_offsets;  // storage key -> file offset of its bytes
  const PickledTensor* find(const std::string& name) const;  // nullptr when absent
};

// The pickle and the records' places, no tensor data. CheckpointError naming `path` for a file
// that is no torch.save zip, a pickle that is no state dict, a record missing or too short.
TorchSaveIndex read_torch_save_index(ReadableFile& file, const std::string& path);

// Elements [offset, offset + dst.numel()) of the flattened tensor into `dst` (any shape, the
// tensor's dtype; on the host or a GPU). CheckpointError for a range outside the tensor, a dtype
// mismatch, or a tensor stored with strides that are not row-major (read it whole instead).
void read_torch_save_range(ReadableFile& file, const std::string& path,
                           const TorchSaveIndex& index, const PickledTensor& tensor,
                           int64_t offset, at::Tensor dst);

// One tensor whole, row-major in its own memory (any strides: a view's storage span is read,
// then copied out).
at::Tensor read_torch_save_tensor(ReadableFile& file, const std::string& path,
                                  const TorchSaveIndex& index, const PickledTensor& tensor);

// Every tensor whole, each in its own memory, in the file's order (any strides).
NamedTensors read_torch_save(FileSystem& fs, const std::string& path);

}  // namespace checkpoint
}  // namespace deepspeed
