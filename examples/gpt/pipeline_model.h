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

// GPT-2 initialisation of one built layer, as GPTImpl gives the whole model: Linear and Embedding
// weights N(0, 0.02), Linear biases 0 (LayerNorm keeps ones and zeros). Drawn from the generator
// the pipeline seeded for the layer (config seed + layer index), so every layout starts alike.
void gpt2_init_layer(torch::nn::Module& layer);

// The layers start GPT-2 style (gpt2_init_layer), as the whole GPT does.
deepspeed::pipe::PipelineModule gpt_pipeline(const GPTConfig& c);

}  // namespace gpt
