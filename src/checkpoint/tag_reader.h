// Reading one checkpoint tag folder (layout.h): the manifest, then files on demand, each verified
// against the manifest (size and crc32c) before it is parsed, and the assembly of any range of a
// parameter's fp32 state from the fragments of whichever ranks saved it.
// Thread-safety: none; one reader per thread.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "checkpoint/file_system.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"

namespace deepspeed {
namespace checkpoint {

struct TrainableInfo {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
};

class TagReader {
 public:
  // Reads tag_dir/manifest.json and checks its format. Throws CheckpointError naming the file
  // (a missing manifest means the save never completed).
  TagReader(FileSystem& fs, std::string tag_dir);

  const std::string& dir() const { return dir_; }
  const Manifest& manifest() const { return manifest_; }
  const nlohmann::json& meta() const { return manifest_.metadata; }
  int world_size() const { return world_size_; }
  int zero_stage() const { return zero_stage_; }
  const std::string& optimizer_format() const { return optimizer_format_; }
  const std::vector<TrainableInfo>& trainable() const { return trainable_; }

  // `name` (relative to the tag folder), verified and parsed once. Throws CheckpointError naming
  // the file: missing, truncated, corrupted, not listed in the manifest, unparsable.
  const SafetensorsFile& file(const std::string& name);
  // The JSON under kMetadataKey of that file's "__metadata__".
  nlohmann::json file_metadata(const std::string& name);
  // Tensor `tensor` of file `name`; throws CheckpointError naming both when absent.
  at::Tensor tensor(const std::string& name, const std::string& tensor);
  // Fills `dst` (fp32, numel elements) with state `kind` ("fp32", "exp_avg", "exp_avg_sq") of
  // trainable parameter `param`, elements [offset, offset + numel), from the rank files holding
  // pieces of it. Throws CheckpointError when the saved pieces do not cover the range.
  void read_range(const std::string& kind, const std::string& param, int64_t offset, at::Tensor dst);
  // Ranks whose files hold some of [offset, offset + numel) of `param`.
  std::vector<int> ranks_holding(const std::string& param, int64_t offset, int64_t numel) const;

 private:
  struct Piece {
    int rank = 0;
    int64_t offset = 0, numel = 0;
  };
  [[noreturn]] void bad(const std::string& what) const;

  FileSystem& fs_;
  std::string dir_;
  Manifest manifest_;
  int world_size_ = 0;
  int zero_stage_ = 0;
  std::string optimizer_format_;
  std::vector<TrainableInfo> trainable_;
  std::map<std::string, std::vector<Piece>> pieces_;  // parameter -> saved fragments
  std::map<std::string, SafetensorsFile> files_;
  std::map<std::string, std::map<std::string, at::Tensor>> tensors_;
};

// The dtype/shape of every tensor of a safetensors file, read from its header alone:
// {"<tensor>": {"dtype": "F32", "shape": [..]}}. Throws CheckpointError naming the file.
nlohmann::json safetensors_tensor_list(FileSystem& fs, const std::string& path);

// "<dir>/latest" trimmed, or "" when there is none. Throws CheckpointError when it is empty.
std::string read_latest_tag(FileSystem& fs, const std::string& dir);

}  // namespace checkpoint
}  // namespace deepspeed
