// The example GPT as a deepspeed::pipe::PipelineModule: [embedding, block x n_layer, final
// LayerNorm, head] — or, with tie_embeddings, the embedding as a TiedLayerSpec reused as the head
// (logits = x @ wte^T), held by the first and the last stage.
#pragma once
#include "deepspeed/pipe.h"
#include "gpt/model.h"

namespace gpt {

// Token + position embedding: [B, T] int64 -> [B, T, C].
class EmbeddingLayerImpl : public torch::nn::Module {
 public:
  explicit EmbeddingLayerImpl(const GPTConfig& c);
  torch::Tensor forward(const torch::Tensor& idx);
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
};
TORCH_MODULE(EmbeddingLayer);

// The layers start GPT-2 style (gpt2_init, model.h), as the whole GPT does: each one drawn from
// the generator the pipeline seeded for it (config seed + layer index), so every layout starts
// alike. With c.activation_checkpointing every layer is a checkpointed segment
// (activation_checkpoint_interval 1); without, the config's pipeline.activation_checkpoint_interval
// applies (-1).
deepspeed::pipe::PipelineModule gpt_pipeline(const GPTConfig& c);

}  // namespace gpt
