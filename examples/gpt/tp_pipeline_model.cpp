#include "gpt/tp_pipeline_model.h"

#include "gpt/pipeline_model.h"
#include "gpt/tp_model.h"

namespace gpt {
namespace F = torch::nn::functional;
namespace tp = deepspeed::tp;
using deepspeed::comm::CommunicatorPtr;
using deepspeed::pipe::LayerSpec;

TPEmbeddingLayerImpl::TPEmbeddingLayerImpl(const GPTConfig& c, const CommunicatorPtr& group) {
  wte = register_module("wte", tp::VocabParallelEmbedding(c.vocab_size, c.n_embd, group));
  wpe = register_module("wpe", torch::nn::Embedding(c.block_size, c.n_embd));
}

torch::Tensor TPEmbeddingLayerImpl::forward(const torch::Tensor& idx) {
  auto pos = torch::arange(idx.size(1), idx.options().dtype(torch::kLong));
  return wte->forward(idx) + wpe->forward(pos);
}

namespace {
// A split layer holding the slices of `full` (built and GPT-2 initialised first, as
// gpt_pipeline()'s layer, so the RNG draws are the unsplit layer's whatever the split layer's
// constructor draws after it).
template <class Split, class Full>
std::function<torch::nn::AnyModule()> split_of(std::function<Full()> full,
                                               std::function<Split()> split) {
  return [full, split] {
    auto whole = full();
    gpt2_init(*whole.ptr());
    auto part = split();
    copy_slices(*part.ptr(), *whole.ptr());
    return torch::nn::AnyModule(part);
  };
}
}  // namespace

deepspeed::pipe::PipelineModule gpt_tp_pipeline(const GPTConfig& c, CommunicatorPtr g) {
  check_tensor_parallel(c, g->world_size());
  deepspeed::pipe::PipelineModule m;
  auto embedding = split_of<TPEmbeddingLayer, EmbeddingLayer>(
      [c] { return EmbeddingLayer(c); }, [c, g] { return TPEmbeddingLayer(c, g); });
  if (c.tie_embeddings)
    m.layers.push_back(deepspeed::pipe::TiedLayerSpec("embed", embedding, nullptr, "embedding"));
  else
    m.layers.emplace_back("embedding", embedding);
  for (int64_t i = 0; i < c.n_layer; ++i)
    m.layers.emplace_back("block", split_of<TPBlock, Block>([c] { return Block(c); },
                                                            [c, g] { return TPBlock(c, g); }));
  m.layers.emplace_back("ln_f", [c] {
    return torch::nn::AnyModule(LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
  });
  if (c.tie_embeddings) {
    // The embedding's rows are this rank's columns of the head: a column layer on a replicated
    // input (copy_to_region: its gradient is all-reduced over the group in backward).
    m.layers.push_back(deepspeed::pipe::TiedLayerSpec(
        "embed", embedding,
        [g](torch::nn::AnyModule& e, const at::Tensor& x) {
          return F::linear(tp::copy_to_region(x, g), e.get<TPEmbeddingLayer>()->wte->weight);
        },
        "head(tied)"));
  } else {
    auto head_options = [c] {
      tp::ColumnParallelLinearOptions o;
      o.in_features = c.n_embd;
      o.out_features = c.vocab_size;
      o.bias = false;
      return o;
    };
    m.layers.emplace_back(
        "head", split_of<tp::ColumnParallelLinear, torch::nn::Linear>(
                    [c] {
                      return torch::nn::Linear(
                          torch::nn::LinearOptions(c.n_embd, c.vocab_size).bias(false));
                    },
                    [head_options, g] { return tp::ColumnParallelLinear(head_options(), g); }));
  }
  // As gpt_pipeline(): with activation_checkpointing every layer is a checkpointed segment.
  m.activation_checkpoint_interval = c.activation_checkpointing ? 1 : -1;
  // Logits split by vocabulary: the loss over the group, in fp32 as gpt_pipeline()'s.
  m.loss_fn = [g](const at::Tensor& logits, const at::Tensor& targets) {
    const at::Tensor flat_targets = targets.reshape({-1});
    const at::Tensor losses = tp::vocab_parallel_cross_entropy(
        logits.reshape({-1, logits.size(-1)}).to(torch::kFloat), flat_targets, g);
    // The mean over the tokens not ignored (-100), as F::cross_entropy's in the unsplit GPT.
    return losses.sum() / flat_targets.ne(-100).sum().clamp_min(1);
  };
  return m;
}

}  // namespace gpt
