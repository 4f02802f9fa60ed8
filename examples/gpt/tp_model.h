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
// Each block is a deepspeed::ZeroUnit (ZeRO-3 gathers it just before it runs).
// Training only (no kv-cache; inference shards the plain GPT with deepspeed::init_inference).
// Residual dropout (GPTConfig::dropout) acts on the replicated activations after each row layer,
// so every tensor rank must draw the same mask: the first training forward of each block checks
// that the ranks' default generators agree and throws ConfigError otherwise. With activation_checkpointing each block is a checkpoint; under
// activation_checkpointing.partition_activations its saved input is split over the group
// (deepspeed/checkpointing.h).
#pragma once
#include <torch/torch.h>

#include "deepspeed/tp.h"
#include "gpt/model.h"

namespace gpt {

// Throws deepspeed::ConfigError naming the value when N does not divide n_head, n_embd or (with
// split_vocabulary: training's layout) vocab_size. Inference (init_inference) splits no
// vocabulary: gpt_generate passes false.
void check_tensor_parallel(const GPTConfig& c, int tensor_parallel, bool split_vocabulary = true);

// Throws ConfigError (on every rank) unless `generator_state` (a random generator's get_state())
// is the same on every rank of `g`: TPBlock's dropout masks must be. COLLECTIVE over g.
void check_same_rng_state(const deepspeed::comm::CommunicatorPtr& g,
                          const at::Tensor& generator_state);

// Copies into every parameter of `split` (a module of tensor-parallel layers) its rank's slice of
// the parameter of the same name in `full` (the unsplit module built with the same seed). Throws
// ConfigError naming a parameter `full` lacks. Local.
void copy_slices(torch::nn::Module& split, torch::nn::Module& full);

class TPAttentionImpl;
class TPMLPImpl;
// One pre-LayerNorm block (BlockImpl's parameter names): [B, T, C] -> [B, T, C], replicated in
// and out. COLLECTIVE over the group (forward: two all-reduces; backward: two).
class TPBlockImpl : public torch::nn::Module {
 public:
  TPBlockImpl(const GPTConfig& c, const deepspeed::comm::CommunicatorPtr& g);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  double dropout_;
  deepspeed::comm::CommunicatorPtr group_;
  bool rng_checked_ = false;
  LayerNorm ln1_{nullptr}, ln2_{nullptr};
  std::shared_ptr<TPAttentionImpl> attn_;
  std::shared_ptr<TPMLPImpl> mlp_;
};
TORCH_MODULE(TPBlock);

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
  // Each block a ZeRO-3 unit, as in GPTImpl: under stage 3 its (split) parameters are partitioned
  // over the data-parallel group and gathered only while it runs.
  std::vector<std::shared_ptr<deepspeed::ZeroUnit<TPBlock>>> blocks_;
  LayerNorm ln_f_{nullptr};
  deepspeed::tp::ColumnParallelLinear head_{nullptr};  // null when tied
};
TORCH_MODULE(TPGPT);

}  // namespace gpt
