// safetensors files (https://github.com/huggingface/safetensors, "Format"), written and read
// without Python:
//   8 bytes   N, little-endian uint64: length of the header
//   N bytes   UTF-8 JSON: {"__metadata__": {str: str}, "<name>": {"dtype": "F32", "shape": [2, 3],
//             "data_offsets": [begin, end]}, ...}, padded with spaces so 8 + N is a multiple of 8
//   rest      the tensors' bytes, little-endian, row-major; offsets are relative to this buffer
// Tensors are stored contiguously, in the order given; "__metadata__" comes first when present.
// Thread-safety: free functions, no shared state.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "checkpoint/file_system.h"

namespace deepspeed {
namespace checkpoint {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;
using SafetensorsMetadata = std::map<std::string, std::string>;

struct SafetensorsFile {
  NamedTensors tensors;  // in data order
  SafetensorsMetadata metadata;
};

// "F32", "BF16", "F16", "F64", "I64", "I32", "I16", "I8", "U8", "BOOL"; throws CheckpointError for
// dtypes safetensors cannot hold here.
std::string safetensors_dtype_name(at::ScalarType dtype);

// The header bytes (length prefix + padded JSON) for these tensors: exposed so tests can check them
// byte for byte. REQUIRES: unique names, none "__metadata__".
std::string safetensors_header(const NamedTensors& tensors, const SafetensorsMetadata& metadata);

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

}  // namespace checkpoint
}  // namespace deepspeed
