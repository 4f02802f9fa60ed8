// The example GPT split across a tensor-parallel group (Megatron's layout, deepspeed/tp.h):
//   token embedding   VocabParallelEmbedding (rows of the vocabulary)
//   attention         q/k/v ColumnParallelLinear (fused, each of q, k, v split: n_head / N heads
//                     per rank), output projection RowParallelLinear
//   MLP               fc ColumnParallelLinear, proj RowParallelLinear
//   head              ColumnParallelLinear without gather (logits split by vocabulary) and
//                     tp::vocab_parallel_cross_entropy; tied: the embedding's rows
//   positions, LayerNorms, row-layer biases   replicated
// Parameter names are GPTImpl's (block0.attn.qkv.weight, ...), so copy_from() takes each slice
// from the unsplit model built with the same seed, and the two compute the same function.
// Training only (no kv-cache, dropout or activation checkpointing; inference shards the plain
// GPT with deepspeed::init_inference).
#pragma once
#include <torch/torch.h>

#include "deepspeed/tp.h"
#include "gpt/model.h"

namespace gpt {

// Throws deepspeed::ConfigError naming the value when N does not divide n_head, n_embd or
// vocab_size, or the configuration uses what this model lacks (dropout, activation checkpointing).
void check_tensor_parallel(const GPTConfig& c, int tensor_parallel);

class TPBlockImpl;
class TPGPTImpl : public torch::nn::Module {
 public:
  // COLLECTIVE-free to build; forward/backward are COLLECTIVE over `group`.
  TPGPTImpl(const GPTConfig& c, deepspeed::comm::CommunicatorPtr group);
  // Mean cross-entropy over all B*T tokens (the same on every rank of the group).
  torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets);
  // This rank's slices of `full`'s parameters (matched by name). Local.
  void copy_from(torch::nn::Module& full);
  const GPTConfig& config() const { return config_; }

 private:
  torch::Tensor logits_split(const torch::Tensor& idx);  // [B, T, vocab / N]
  GPTConfig config_;
  deepspeed::comm::CommunicatorPtr group_;
  deepspeed::tp::VocabParallelEmbedding wte_{nullptr};
  torch::nn::Embedding wpe_{nullptr};
  std::vector<std::shared_ptr<TPBlockImpl>> blocks_;
  torch::nn::LayerNorm ln_f_{nullptr};
  deepspeed::tp::ColumnParallelLinear head_{nullptr};  // null when tied
};
TORCH_MODULE(TPGPT);

}  // namespace gpt
