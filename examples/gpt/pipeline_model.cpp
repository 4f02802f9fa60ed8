#include "gpt/pipeline_model.h"

namespace gpt {
namespace F = torch::nn::functional;
using deepspeed::pipe::LayerSpec;

EmbeddingLayerImpl::EmbeddingLayerImpl(const GPTConfig& c) {
  wte = register_module("wte", torch::nn::Embedding(c.vocab_size, c.n_embd));
  wpe = register_module("wpe", torch::nn::Embedding(c.block_size, c.n_embd));
}

torch::Tensor EmbeddingLayerImpl::forward(const torch::Tensor& idx) {
  auto pos = torch::arange(idx.size(1), idx.options().dtype(torch::kLong));
  return wte->forward(idx) + wpe->forward(pos);
}

namespace {
// A layer built and initialised GPT-2 style.
template <class Holder>
torch::nn::AnyModule gpt2_layer(Holder layer) {
  gpt2_init(*layer.ptr());
  return torch::nn::AnyModule(layer);
}
}  // namespace

deepspeed::pipe::PipelineModule gpt_pipeline(const GPTConfig& c) {
  deepspeed::pipe::PipelineModule m;
  auto embedding = [c] { return gpt2_layer(EmbeddingLayer(c)); };
  if (c.tie_embeddings)
    m.layers.push_back(deepspeed::pipe::TiedLayerSpec("embed", embedding, nullptr, "embedding"));
  else
    m.layers.emplace_back("embedding", embedding);
  for (int64_t i = 0; i < c.n_layer; ++i)
    m.layers.emplace_back("block", [c] { return gpt2_layer(Block(c)); });
  m.layers.emplace_back("ln_f", [c] {
    return torch::nn::AnyModule(LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
  });
  if (c.tie_embeddings) {
    m.layers.push_back(deepspeed::pipe::TiedLayerSpec(
        "embed", embedding,
        [](torch::nn::AnyModule& e, const at::Tensor& x) {
          return F::linear(x, e.get<EmbeddingLayer>()->wte->weight);
        },
        "head(tied)"));
  } else {
    m.layers.emplace_back("head", [c] {
      return gpt2_layer(
          torch::nn::Linear(torch::nn::LinearOptions(c.n_embd, c.vocab_size).bias(false)));
    });
  }
  // --activation_checkpointing: every layer a checkpointed segment, as GPTImpl checkpoints every
  // block; without it -1 leaves the config's pipeline.activation_checkpoint_interval in charge.
  m.activation_checkpoint_interval = c.activation_checkpointing ? 1 : -1;
  // The loss in fp32 whatever the model dtype, as GPTImpl::forward.
  m.loss_fn = [](const at::Tensor& logits, const at::Tensor& targets) {
    return F::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat),
                            targets.reshape({-1}));
  };
  return m;
}

}  // namespace gpt
