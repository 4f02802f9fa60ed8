// gpt_train's model flags saved beside each checkpoint, so that gpt_generate builds the model the
// weights were trained as. Loading by name and shape alone cannot tell every wrong flag: --n_head
// and --gelu_tanh change no tensor, and a smaller --n_layer, --tie_embeddings on an untied
// checkpoint or --no_bias on a biased one leave checkpoint tensors unread; each loads and
// generates garbage.
//
// The file is <tag folder>/gpt_model.json, written by global rank 0 after each save:
//   {"n_layer": 4, "n_head": 4, "n_embd": 256, "block_size": 128, "vocab_size": 256,
//    "bias": true, "tie_embeddings": false, "gelu_tanh": false}
// (dropout and activation_checkpointing change training only and are left out). A checkpoint
// saved by an older gpt_train has none: then the command line's flags are taken, and
// check_no_leftovers (generate.h) refuses checkpoint tensors the model does not read.
#pragma once
#include <nlohmann/json.hpp>

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "gpt/model.h"

namespace gpt {

inline constexpr char kModelFlagsFile[] = "gpt_model.json";

// The flags that set the saved fields, as gpt_train and gpt_generate spell them:
// --n_layer, --n_head, --n_embd, --block_size, --vocab_size, --no_bias, --tie_embeddings,
// --gelu_tanh.
const std::vector<std::string>& model_flag_names();

// The saved fields of `c` (the JSON above).
nlohmann::json model_flags_json(const GPTConfig& c);

// The tag folder `load_dir` and `tag` name, as init_inference resolves them: `load_dir` itself
// when no tag is given and it holds a manifest.json (a tag folder), else load_dir/<tag>, the tag
// being `tag` or the content of load_dir/latest (a save interrupted mid-swap: <tag>.replacing).
// "" for a weights file (.safetensors, or a torch.save file) or a folder without `latest` (the
// loader reports what is missing).
std::string checkpoint_tag_dir(const std::string& load_dir, const std::string& tag);

// Writes <the tag folder save_dir/latest names>/gpt_model.json atomically (a temporary file,
// fsynced, renamed over it). Call it on global rank 0 only, after save_checkpoint returned.
// Throws deepspeed::CheckpointError naming the file when it cannot be written.
void save_model_flags(const std::string& save_dir, const GPTConfig& c);

// The model <tag_dir>/gpt_model.json describes; nullopt when there is no such file (a checkpoint
// of an older gpt_train, a weights file: tag_dir ""). Throws deepspeed::ConfigError naming
// the file and the key when a key is missing, unknown or of the wrong type.
std::optional<GPTConfig> read_model_flags(const std::string& tag_dir);

// The model to build. Without a saved file: `parsed` (the command line, defaults included).
// With one: the saved fields, other fields (dropout ...) from `parsed`; a flag named in `given`
// (model_flag_names' spelling) whose value differs from the saved one throws
// deepspeed::ConfigError naming the flag, both values and `file`.
GPTConfig resolve_model_flags(const GPTConfig& parsed, const std::set<std::string>& given,
                              const std::optional<GPTConfig>& saved, const std::string& file);

// The names of the tensors a checkpoint holds, read without any weight: a tag folder's trainable
// parameters (its manifest.json), or a weights file's tensors (a safetensors header, a torch.save
// pickle), or a model folder's (ds_to_fp32's output: its one file, or its index's shards). Empty
// when there is none of them (the loader reports that). Throws
// deepspeed::CheckpointError for a file or manifest it cannot parse.
std::vector<std::string> stored_tensor_names(const std::string& load_dir, const std::string& tag);

}  // namespace gpt
