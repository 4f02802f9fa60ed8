// safetensors files (https://github.com/huggingface/safetensors, "Format"), written and read
// without Python:
//   8 bytes   N, little-endian uint64: length of the header
//   N bytes   UTF-8 JSON: {"__metadata__": {str: str}, "<name>": {"dtype": "F32", "shape": [2, 3],
//             "data_offsets": [begin, end]}, ...}, padded with spaces so 8 + N is a multiple of 8
//   rest      the tensors' bytes, little-endian, row-major; offsets are relative to this buffer
// Tensors are stored contiguously, in the order given; "__metadata__" comes first when present.
// Thread-safety: free functions, no shared state.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "checkpoint/file_system.h"
#include "checkpoint/tensor_sink.h"

namespace deepspeed {
namespace checkpoint {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;
using SafetensorsMetadata = std::map<std::string, std::string>;

struct SafetensorsFile {
  NamedTensors tensors;  // in data order
  SafetensorsMetadata metadata;
};

// One tensor of a file as its header describes it.
struct SafetensorsEntry {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range in the data section
  int64_t numel() const;
};

// A file's header alone: what it holds and where, so tensors (or ranges of them) can be read one
// at a time without the whole file in memory.
struct SafetensorsIndex {
  std::vector<SafetensorsEntry> entries;  // in header order
  SafetensorsMetadata metadata;
  uint64_t data_start = 0;  // file offset of the data section (8 + header length)
  // nullptr when there is no such tensor.
  const SafetensorsEntry* find(const std::string& name) const;
};

// "F32", "BF16", "F16", "F64", "I64", "I32", "I16", "I8", "U8", "BOOL"; throws CheckpointError for
// dtypes safetensors cannot hold here.
std::string safetensors_dtype_name(at::ScalarType dtype);

// The header bytes (length prefix + padded JSON) for these tensors: exposed so tests can check them
// byte for byte. REQUIRES: unique names, none "__metadata__".
std::string safetensors_header(const NamedTensors& tensors, const SafetensorsMetadata& metadata);

// The header bytes for tensors described by (name, dtype, shape) alone, in the given order.
std::string safetensors_header(const std::vector<SafetensorsEntry>& entries,
                               const SafetensorsMetadata& metadata);

// Receives the data of a file whose header is already written, piece by piece, in header order:
// append(piece) adds the next bytes of the current tensor (any number of pieces per tensor, each
// of the tensor's dtype; contiguous CPU). So a file is written without any of its tensors whole in
// memory. Throws CheckpointError for a piece of the wrong dtype or one that runs past the tensors.
class SafetensorsWriter final : public TensorSink {
 public:
  SafetensorsWriter(WritableFile& file, std::string path, std::vector<SafetensorsEntry> entries);
  void append(const at::Tensor& piece) override;
  void append_zeros(at::ScalarType dtype, int64_t numel);
  // Every tensor's bytes were appended; throws CheckpointError naming the first short one.
  void finish() const;

 private:
  void advance(at::ScalarType dtype, uint64_t bytes, const void* data);
  WritableFile& file_;
  std::string path_;
  std::vector<SafetensorsEntry> entries_;
  size_t current_ = 0;       // the tensor being written
  uint64_t written_ = 0;     // bytes of it so far
};

// Writes atomically a file holding `entries`, whose data `fill` appends in order (the header goes
// first: every size is known from the entries). IOError for I/O failures, CheckpointError for bad
// names or dtypes or for data that do not match the entries.
void write_safetensors_streamed(FileSystem& fs, const std::string& path,
                                const std::vector<SafetensorsEntry>& entries,
                                const SafetensorsMetadata& metadata,
                                const std::function<void(SafetensorsWriter&)>& fill);

// Writes atomically (FileSystem::write_file_atomic). Tensors on another device are copied to the CPU;
// non-contiguous ones are made contiguous. Throws CheckpointError for bad names or dtypes, IOError
// for I/O failures.
void write_safetensors(FileSystem& fs, const std::string& path, const NamedTensors& tensors,
                       const SafetensorsMetadata& metadata = {});
void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const SafetensorsMetadata& metadata = {});

// Validates the header (size, JSON, dtypes, shapes, offsets contiguous and inside the file) and
// reads every tensor into its own CPU tensor. Throws CheckpointError naming the file and tensor.
SafetensorsFile read_safetensors(FileSystem& fs, const std::string& path);
SafetensorsFile read_safetensors(const std::string& path);

// The same validation of the header, reading no tensor data.
SafetensorsIndex read_safetensors_index(ReadableFile& file, const std::string& path);
// Elements [offset, offset + dst.numel()) of the flattened tensor `entry` into `dst` (any
// shape, the entry's dtype; read in place when contiguous). Throws CheckpointError naming the
// file and tensor for a range outside it or a dtype mismatch, IOError for read failures.
void read_safetensors_range(ReadableFile& file, const std::string& path,
                            const SafetensorsIndex& index, const SafetensorsEntry& entry,
                            int64_t offset, at::Tensor dst);

}  // namespace checkpoint
}  // namespace deepspeed
