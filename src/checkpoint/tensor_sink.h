// Where a weights file's tensors go as they are produced: the safetensors writer and the
// torch.save writer both take them in the order their file's entries name, so the walk that
// produces them (the module's parameters, gathered one unit at a time; a consolidated
// checkpoint) need not know the format.
#pragma once
#include <ATen/core/Tensor.h>

namespace deepspeed {
namespace checkpoint {

class TensorSink {
 public:
  virtual ~TensorSink() = default;
  // The next bytes of the file's tensors, in entry order (the writer says whether a tensor may
  // come in pieces). Throws CheckpointError for data that does not match the entries.
  virtual void append(const at::Tensor& data) = 0;
};

}  // namespace checkpoint
}  // namespace deepspeed
