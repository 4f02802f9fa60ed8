// Hugging Face's sharded weights layout, as DeepSpeed's zero_to_fp32.py writes it with
// `--max_shard_size S` (huggingface_hub's split_torch_state_dict_into_shards), in torch.save
// files (its default) or with `--safe_serialization` in safetensors:
//   <dir>/pytorch_model-00001-of-0000N.bin ... | model-00001-of-0000N.safetensors ...
//   <dir>/pytorch_model.bin.index.json | model.safetensors.index.json
//        {"metadata": {"total_size": <bytes of every tensor>}, "weight_map": {"<name>": "<file>"}}
// or, when everything fits in one shard, <dir>/pytorch_model.bin | model.safetensors alone (no
// index). A "shard" here is one such file (Hugging Face's word), not a ZeRO partition. Used by
// build/bin/ds_to_fp32.
// Thread-safety: free functions, no shared state.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/file_system.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/weights_file.h"

namespace deepspeed {
namespace checkpoint {

// zero_to_fp32's --max_shard_size default.
constexpr const char* kDefaultMaxShardSize = "5GB";
// The single file, and the index of a sharded export, of each format.
constexpr const char* kHfSingleFileName = "model.safetensors";
constexpr const char* kHfIndexFileName = "model.safetensors.index.json";
constexpr const char* kHfTorchSaveFileName = "pytorch_model.bin";
constexpr const char* kHfTorchSaveIndexFileName = "pytorch_model.bin.index.json";
std::string hf_single_file_name(WeightsFormat format);
std::string hf_index_file_name(WeightsFormat format);

// Bytes meant by `text`, as huggingface_hub's parse_size_to_int reads a size plus two forms of
// transformers' convert_file_size_to_int: "<number><unit>" with unit KB, MB, GB, TB (powers of
// 1000) or KiB, MiB, GiB, TiB (powers of 1024), any case, optional spaces ("5GB", "5 gb",
// "1.5GB" = 1500000000, a fraction rounded down); a bare integer is bytes ("1000"). Throws
// ConfigError "<what> '<text>': ..." for anything else, for 0 bytes and for sizes past 2^63.
uint64_t parse_byte_size(const std::string& text, const std::string& what);

// Files and their tensors for one export.
struct ShardPlan {
  struct Shard {
    std::string file;                // name inside the output folder
    std::vector<std::string> names;  // its tensors, in the order given
    uint64_t bytes = 0;              // their data bytes (the header not counted)
  };
  std::vector<Shard> shards;  // in file-number order
  uint64_t total_size = 0;    // the index's metadata.total_size: every tensor's bytes
  WeightsFormat format = WeightsFormat::safetensors;
  // More than one file: named model-<i>-of-<n>.safetensors (pytorch_model-<i>-of-<n>.bin), with
  // an index (hf_index_file_name(format)).
  bool sharded() const { return shards.size() > 1; }
  // {"metadata": {"total_size": N}, "weight_map": {name: file}} with keys sorted, indented by 2
  // and a final newline, as zero_to_fp32 writes it (json.dumps(indent=2, sort_keys=True)).
  std::string index_json() const;
};

// Splits tensors given as (name, data bytes), in state-dict order, as huggingface_hub does:
// tensors join the current shard until one would take it past `max_shard_size` bytes, which
// then starts the next; a tensor larger than the limit on its own gets a shard to itself, placed
// at once before the shard still being filled (which continues after it, so file numbers need not
// follow the state-dict order; the index tells where each tensor is). One shard is named
// model.safetensors; n > 1 are model-<i>-of-<n>.safetensors (numbers of 5 digits or more). No
// tensors at all give one empty model.safetensors (huggingface_hub returns no file). Each name
// counts its own bytes, as zero_to_fp32 sizes tied names (copies, not one storage). The names
// are those of `format` (pytorch_model.bin, pytorch_model-<i>-of-<n>.bin for torch.save).
// REQUIRES: max_shard_size >= 1; unique names.
ShardPlan plan_shards(const std::vector<std::pair<std::string, uint64_t>>& sizes,
                      uint64_t max_shard_size,
                      WeightsFormat format = WeightsFormat::safetensors);
// The same for tensors (numel x element size each).
ShardPlan plan_shards(const NamedTensors& tensors, uint64_t max_shard_size,
                      WeightsFormat format = WeightsFormat::safetensors);

// True for the names an export of either format writes into its folder: model.safetensors,
// model.safetensors.index.json, model-<digits>-of-<digits>.safetensors, pytorch_model.bin,
// pytorch_model.bin.index.json and pytorch_model-<digits>-of-<digits>.bin.
bool is_hf_export_file_name(const std::string& name);

// What write_hf_export did.
struct HfExport {
  ShardPlan plan;
  std::vector<std::string> removed;  // names of an earlier export's files it deleted
};

// Writes `tensors` into folder `dir` (created if missing) in the layout above, in `format`, every
// file through `fs` (write_weights: atomic; an IOError names the file) with `metadata` in each
// safetensors shard:
//   1. removes an earlier export's indexes (of either format), and its files that this export
//      does not write again, of either format (a stale model-*-of-*.safetensors would be globbed
//      by loaders; transformers loads a stale model.safetensors before a new pytorch_model.bin),
//      so the folder holds no index until
//   2. every shard is written, and then
//   3. the index, last: a folder with an index is complete.
// A failure part-way leaves no index. Other files of the folder are left alone.
HfExport write_hf_export(FileSystem& fs, const std::string& dir, WeightsFormat format,
                         const NamedTensors& tensors, uint64_t max_shard_size,
                         const SafetensorsMetadata& metadata = {});

}  // namespace checkpoint
}  // namespace deepspeed
