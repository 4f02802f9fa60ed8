// The data.pkl of a torch.save file holding a state dict, read without Python: which tensors it
// names, of what dtype, shape and strides, in which storage record and where in it. A restricted
// unpickler, as torch.load(weights_only=True): only the globals a state dict needs
// (collections.OrderedDict, torch._utils._rebuild_tensor_v2 / _rebuild_parameter,
// torch.<Dtype>Storage) are resolved; any other global (os.system, a class of the model's code)
// is refused naming it, so a file cannot run code here. Protocols 2-5 (torch.save writes 2).
// Thread-safety: free functions, no shared state.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace deepspeed {
namespace checkpoint {

// torch.save's storage class for a dtype ("FloatStorage", "BFloat16Storage", ...), nullptr for a
// dtype it is not written for here; and back (kUndefined for a name that is no storage class).
// One table for the writer (torch_save.cpp) and the reader.
const char* torch_storage_class(at::ScalarType dtype);
at::ScalarType dtype_of_torch_storage_class(const std::string& name);

// One tensor of a state dict as its pickle describes it.
struct PickledTensor {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape, stride;
  std::string storage_key;     // the record "data/<key>"
  int64_t storage_offset = 0;  // in elements
  int64_t storage_numel = 0;   // elements of the whole storage (shared by tied tensors)
  int64_t numel() const;
  bool contiguous() const;     // row-major strides (dimensions of size 1 may have any stride)
};

// The top-level {name: tensor} dict (a dict or an OrderedDict; its _metadata is ignored), in the
// file's order. Throws CheckpointError naming `path` and what is wrong: a global not allowed, an
// opcode not supported, a value that is not a tensor (a nested dict names its key: a whole
// training checkpoint, not a state dict), a malformed pickle.
std::vector<PickledTensor> read_state_dict_pickle(const std::string& pickle,
                                                  const std::string& path);

}  // namespace checkpoint
}  // namespace deepspeed
