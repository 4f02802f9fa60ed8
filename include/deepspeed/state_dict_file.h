// A state dict file as PyTorch users have them, read in C++ without Python: a torch.save file
// (pytorch_model.bin of Hugging Face, DeepSpeed's save_16bit_model and zero_to_fp32, or
// deepspeed.cpp's own) or a safetensors file (a name ending in ".safetensors"). A torch.save
// file is read by a restricted unpickler that runs no code (as torch.load(weights_only=True):
// only a dict of tensors is accepted; any other global is refused naming it) and PyTorch's zip
// format only (torch >= 1.6's default).
//
// `path` may also be a model folder as Hugging Face lays it out and ds_to_fp32 writes it: one file
// (model.safetensors or pytorch_model.bin) or shards and their index
// (model.safetensors.index.json / pytorch_model.bin.index.json, which may be named itself). A
// folder holding several is read as transformers reads it: model.safetensors first, then its
// index, pytorch_model.bin, its index. A sharded folder's tensors are those its index names.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace deepspeed {

// Every tensor, whole, on the host, in the file's order (a sharded folder's: its shards by name),
// each in its own memory (tensors that share a storage in the file — tied weights — are copies
// here). Throws CheckpointError naming the file and what is wrong (a folder without any of the
// four files, a missing shard, a shard without a tensor its index puts there).
std::vector<std::pair<std::string, at::Tensor>> load_state_dict_file(const std::string& path);

// The tensors' names alone, in the same order (no tensor data read).
std::vector<std::string> state_dict_file_names(const std::string& path);

}  // namespace deepspeed
