// The example GPT as a PipelineModule whose layers are split over a tensor-parallel group
// (world = pipe x data x tensor): gpt_pipeline()'s layers with gpt::TPGPT's split —
//   embedding   VocabParallelEmbedding + replicated positions (TPEmbeddingLayer)
//   blocks      TPBlock (column/row-parallel attention and MLP)
//   ln_f        replicated LayerNorm
//   head        ColumnParallelLinear, logits split by vocabulary, and the loss
//               tp::vocab_parallel_cross_entropy; with tie_embeddings the embedding's rows
// Each layer is built as gpt_pipeline()'s layer first (same seed, same draws) and its slices are
// copied in, so the split pipeline starts from exactly the unsplit one's weights, and trains as
// gpt_pipeline() on pipe x data (or PipelineSequential) would. The activations between layers are
// [B, T, C] replicated across the group; only the head's output is split.
#pragma once
#include "deepspeed/pipe.h"
#include "deepspeed/tp.h"
#include "gpt/model.h"

namespace gpt {

// Token (split by vocabulary) + position embedding: [B, T] int64 -> [B, T, C], replicated.
// COLLECTIVE over the group (the embedding's all-reduce).
class TPEmbeddingLayerImpl : public torch::nn::Module {
 public:
  TPEmbeddingLayerImpl(const GPTConfig& c, const deepspeed::comm::CommunicatorPtr& group);
  torch::Tensor forward(const torch::Tensor& idx);
  deepspeed::tp::VocabParallelEmbedding wte{nullptr};
  torch::nn::Embedding wpe{nullptr};
};
TORCH_MODULE(TPEmbeddingLayer);

// Throws ConfigError (check_tensor_parallel) when the group's size does not divide the model.
// activation_checkpointing: every layer a checkpointed segment, as gpt_pipeline().
// Layers and loss are COLLECTIVE over `group`.
deepspeed::pipe::PipelineModule gpt_tp_pipeline(const GPTConfig& c,
                                                deepspeed::comm::CommunicatorPtr group);

}  // namespace gpt
