// Where init_inference reads weights from, a range of elements at a time, so a rank reads only
// its slices: a training checkpoint's fp32 masters (any ZeRO stage, world size or pipeline
// layout; buffers and frozen parameters from the module files), a safetensors file or a
// torch.save state dict (ds_to_fp32's or save_16bit_model's output, or PyTorch's).
#pragma once
#include <ATen/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "deepspeed/tp.h"

namespace deepspeed {
namespace tp {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // The whole tensor's shape, or nullopt when the source has no tensor `name`.
  virtual std::optional<std::vector<int64_t>> shape(const std::string& name) = 0;
  // Elements [offset, offset + dst.numel()) of the flattened tensor into `dst` (contiguous,
  // fp32 or the tensor's integer dtype).
  virtual void read(const std::string& name, int64_t offset, at::Tensor dst) = 0;
  virtual const std::string& path() const = 0;
};

// A path ending in .safetensors is a safetensors file, one ending in .index.json a sharded
// folder's index, any other file a torch.save state dict; a folder without `latest` or a
// manifest holding ds_to_fp32's output or a Hugging Face model's weights (checkpoint/
// weights_folder.h: an index and its shards, or model.safetensors / pytorch_model.bin) is that
// folder; anything else a checkpoint (save folder or tag folder; `tag` as
// Engine::load_checkpoint). Throws CheckpointError naming what is missing or unreadable.
std::unique_ptr<WeightSource> open_weights(const std::string& path, const std::string& tag);

// Reads the slices: `shape` is the whole tensor's. Results are new fp32 (or integer) tensors.
at::Tensor read_whole(WeightSource& src, const std::string& name, const std::vector<int64_t>& shape,
                      at::ScalarType dtype);
// Rows r of each of `parts` stacked blocks of dimension 0: [parts * r.size(), ...].
at::Tensor read_rows(WeightSource& src, const std::string& name, const std::vector<int64_t>& shape,
                     int parts, Range r);
// Columns r of a 2-D [out, in] tensor: [out, r.size()].
at::Tensor read_columns(WeightSource& src, const std::string& name,
                        const std::vector<int64_t>& shape, Range r);

}  // namespace tp
}  // namespace deepspeed
