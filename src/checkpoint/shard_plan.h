// Hugging Face's sharded safetensors layout, as DeepSpeed's zero_to_fp32.py writes it with
// `--safe_serialization --max_shard_size S` (huggingface_hub's split_torch_state_dict_into_shards):
//   <dir>/model-00001-of-0000N.safetensors ... model-0000N-of-0000N.safetensors
//   <dir>/model.safetensors.index.json  {"metadata": {"total_size": <bytes of every tensor>},
//                                        "weight_map": {"<tensor name>": "<file>", ...}}
// or, when everything fits in one shard, <dir>/model.safetensors alone (no index). A "shard" here
// is one such file (Hugging Face's word), not a ZeRO partition. Used by build/bin/ds_to_fp32.
// Thread-safety: free functions, no shared state.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/file_system.h"
#include "checkpoint/safetensors.h"

namespace deepspeed {
namespace checkpoint {

// zero_to_fp32's --max_shard_size default.
constexpr const char* kDefaultMaxShardSize = "5GB";
// The single file, and the index of a sharded export.
constexpr const char* kHfSingleFileName = "model.safetensors";
constexpr const char* kHfIndexFileName = "model.safetensors.index.json";

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
  // More than one file: named model-<i>-of-<n>.safetensors, with an index.
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
// counts its own bytes, as zero_to_fp32 sizes tied names (copies, not one storage).
// REQUIRES: max_shard_size >= 1; unique names.
ShardPlan plan_shards(const std::vector<std::pair<std::string, uint64_t>>& sizes,
                      uint64_t max_shard_size);
// The same for tensors (numel x element size each).
ShardPlan plan_shards(const NamedTensors& tensors, uint64_t max_shard_size);

// True for the names an export writes into its folder: model.safetensors,
// model.safetensors.index.json and model-<digits>-of-<digits>.safetensors.
bool is_hf_export_file_name(const std::string& name);

// What write_hf_safetensors did.
struct HfExport {
  ShardPlan plan;
  std::vector<std::string> removed;  // names of an earlier export's files it deleted
};

// Writes `tensors` into folder `dir` (created if missing) in the layout above, every file through
// `fs` (write_safetensors: atomic; an IOError names the file) with `metadata` in each shard:
//   1. removes an earlier export's index, and its files that this export does not write again
//      (a stale model-*-of-*.safetensors would be globbed by loaders; a stale model.safetensors
//      next to an index is what transformers loads first), so the folder holds no index until
//   2. every shard is written, and then
//   3. the index, last: a folder with an index is complete.
// A failure part-way leaves no index. Other files of the folder are left alone.
HfExport write_hf_safetensors(FileSystem& fs, const std::string& dir, const NamedTensors& tensors,
                              uint64_t max_shard_size, const SafetensorsMetadata& metadata = {});

}  // namespace checkpoint
}  // namespace deepspeed
