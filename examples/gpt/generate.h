// Text generation with the example GPT: a batch of prompts of different lengths (left-padded, the
// padding masked and positions counted per row), a kv-cache, greedy or top-k / top-p sampling
// with a seed. And loading a training checkpoint's weights (any world size or ZeRO stage:
// consolidated from the fp32 masters, as ds_to_fp32 does) into a GPT for it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "gpt/model.h"

namespace gpt {

struct SamplingOptions {
  bool greedy = true;      // argmax; otherwise sample
  int64_t top_k = 0;       // keep the k most likely tokens (0: all); >= 0
  double top_p = 1.0;      // keep the smallest set whose probability reaches p (1: all; the
                           // most likely token is always kept, so 0 is greedy); in [0, 1]
  double temperature = 1.0;  // divides the logits; > 0
  uint64_t seed = 0;       // the sampling generator's seed (the global RNG is not touched)
};

// Throws deepspeed::ConfigError naming the option (`prefix` + its name: "--" names the
// command-line flag) when top_k < 0, top_p is outside [0, 1] or temperature is not a finite
// number > 0, as Hugging Face's generate refuses them. Checked even when greedy (HF only warns
// then): such a value is a mistake whichever mode reads it.
void check_sampling(const SamplingOptions& options, const std::string& prefix = "");

// Continues each prompt by `max_new_tokens` tokens; returns only the new tokens per prompt.
// `use_cache` false recomputes the whole context at every step (the reference the cache is
// tested against). Throws when a prompt is empty or prompt + new tokens exceed block_size, and
// for the options check_sampling refuses.
std::vector<std::vector<int64_t>> generate(GPTImpl& model,
                                           const std::vector<std::vector<int64_t>>& prompts,
                                           int64_t max_new_tokens, const SamplingOptions& options,
                                           bool use_cache = true);

// The names tensor `name` of the GPT may have in a checkpoint: its own, and for a pipeline
// checkpoint of gpt_train --pipeline_stages its layer's (block3.ln1.weight -> layer_04.ln1.weight).
std::vector<std::string> checkpoint_names(const std::string& name, const GPTConfig& config);

// Throws deepspeed::CheckpointError naming the first of `stored` (a checkpoint's tensor names,
// `where` its path) that no tensor of `model` reads under any of its checkpoint_names: a tensor of
// a model with more layers, an untied head (head.weight) for a tied model, biases for --no_bias.
// Loading by name reads only what the model asks for, so these would be dropped silently.
void check_no_leftovers(const std::vector<std::string>& stored, const GPTImpl& model,
                        const std::string& where);

// Fills the model's parameters and buffers from the checkpoint tag `tag` of `load_dir` ("": the
// one `latest` names), fp32 masters for the trainable ones. Throws deepspeed::CheckpointError
// naming a tensor the checkpoint lacks or whose shape differs (another --n_embd ...), or one the
// model does not read (check_no_leftovers: another --n_layer, --tie_embeddings, --no_bias).
// --n_head and --gelu_tanh change no tensor: gpt_train's gpt_model.json tells them
// (model_flags.h). Reads plain and pipeline checkpoints (checkpoint_names).
void load_weights(GPTImpl& model, const std::string& load_dir, const std::string& tag = "");

}  // namespace gpt
