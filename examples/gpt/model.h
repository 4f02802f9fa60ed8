// A small GPT in libtorch: byte-level tokens (vocabulary 256), learned positions, pre-LayerNorm
// blocks of causal multi-head self-attention and a GELU MLP, final LayerNorm, linear head.
// Same architecture as bench/ddp_baseline.py so DeepSpeed.cpp and PyTorch DDP train one model.
//
// ZeRO-3: each block is a deepspeed::ZeroUnit (gathered just before it runs, released after); the
// embeddings, final LayerNorm and head are the root unit. Linear layers run through
// deepspeed::zero::linear so a released block's weights are really freed between its forward and
// backward. Without a stage-3 engine both are plain pass-throughs.
#pragma once
#include <torch/torch.h>

#include "deepspeed/zero_unit.h"

namespace gpt {

struct GPTConfig {
  int64_t vocab_size = 256;
  int64_t block_size = 128;  // context length
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 256;
  // The GPU benchmark's shape (bench/gpu, gpu-anchor's GPT): bias-free Linear layers, the head
  // tied to the token embedding, tanh-approximated GELU. The defaults keep the CPU example's.
  bool bias = true;
  bool tie_embeddings = false;
  bool gelu_tanh = false;
  // Residual dropout after each attention and MLP (nanoGPT's resid_dropout); 0 draws nothing.
  double dropout = 0.0;
  // Each block is an activation checkpoint (deepspeed::checkpointing::checkpoint): its
  // activations are recomputed in backward instead of kept. (The pipeline models checkpoint
  // every layer: gpt_pipeline.)
  bool activation_checkpointing = false;
  // GPT-2's scaled initialisation (GPT-2 paper, section 2.3; nanoGPT; gpu-anchor's gpt_bench.py):
  // the weights of the two layers that write into the residual stream, attention proj and MLP
  // proj, drawn with std 0.02 / sqrt(2 * n_layer) instead of 0.02. Off by default: the CPU
  // example's init, which bench/ddp_baseline.py draws too; bench/gpu/run.sh turns it on
  // (gpt_train --scaled_residual_init) for the same model as its PyTorch and DeepSpeed peers.
  bool scaled_residual_init = false;
};

// The std gpt2_init draws the residual projections' weights with: 0.02, or 0.02 /
// sqrt(2 * n_layer) with scaled_residual_init.
double residual_init_std(const GPTConfig& c);

// GPT-2 initialisation of `module` and every module under it: Linear and Embedding weights
// N(0, 0.02), Linear biases 0 (LayerNorm keeps ones and zeros); the residual projections (the
// attention's and the MLP's proj) N(0, residual_init_std of the config they were built with).
// The draws run in module order whatever the stds, so without scaled_residual_init the values are
// those of a plain N(0, 0.02) init. GPTImpl draws it once the whole model is built (as
// bench/ddp_baseline.py does, so both start from the same values);
// gpt_pipeline() draws it for each layer from the generator the pipeline seeded for that layer.
void gpt2_init(torch::nn::Module& module);

// torch::nn::LayerNorm (same parameters, names and options) whose bf16 forward on the CPU
// normalises in fp32 and rounds the result to bf16, as torch.autocast runs layer norm: libtorch
// 1.13's CPU layer norm is 2.4x slower in bf16 than in fp32 (bench/cpu_bf16_ops.py), which made
// the bf16 step 5-9% slower than DDP with autocast (docs/benchmarks.md). Elsewhere (fp32, GPU)
// it is torch::nn::LayerNorm's forward.
class LayerNormImpl : public torch::nn::LayerNormImpl {
 public:
  using torch::nn::LayerNormImpl::LayerNormImpl;
  torch::Tensor forward(const torch::Tensor& x);
};
TORCH_MODULE(LayerNorm);

// Keys and values of the tokens seen so far, per block (generation: each new token attends to
// them instead of recomputing the whole context). Rows may start with left padding: `pad[b]`
// leading positions of row b are not tokens (never attended to; positions count from the first
// real token).
struct KVCache {
  std::vector<torch::Tensor> k, v;  // per block: [B, heads, length, head_dim]
  torch::Tensor pad;                // [B] int64
  int64_t length = 0;               // positions held (padding included)
};

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GPTConfig& c);
  torch::Tensor forward(const torch::Tensor& x);  // x: [B, T, C]
  // x: [B, T, C] of positions [cache.length, cache.length + T); appends their keys and values to
  // `k`, `v` (this block's entries of the cache) and attends to everything held.
  torch::Tensor forward_cached(const torch::Tensor& x, torch::Tensor& k, torch::Tensor& v,
                               const KVCache& cache);
  // gpt2_init: the layer writing into the residual stream, and the std its weight starts with.
  std::pair<const torch::nn::Module*, double> residual_projection() const {
    return {proj_.get(), proj_init_std_};
  }

 private:
  // The heads this module computes follow its q/k/v weight: all of them, or under
  // deepspeed::init_inference's AutoTP this rank's n_head / tp_size (its rows of q, k and v).
  int64_t local_width() const { return qkv_->weight.size(0) / 3; }
  int64_t head_dim_;
  double proj_init_std_;
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr};
  torch::Tensor mask_;  // [T, T] lower-triangular, a buffer
};
TORCH_MODULE(CausalSelfAttention);

class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const GPTConfig& c);
  torch::Tensor forward(const torch::Tensor& x);
  // gpt2_init: as CausalSelfAttentionImpl's.
  std::pair<const torch::nn::Module*, double> residual_projection() const {
    return {proj_.get(), proj_init_std_};
  }

 private:
  bool gelu_tanh_;
  double proj_init_std_;
  torch::nn::Linear fc_{nullptr}, proj_{nullptr};
};
TORCH_MODULE(MLP);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GPTConfig& c);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor forward_cached(const torch::Tensor& x, torch::Tensor& k, torch::Tensor& v,
                               const KVCache& cache);  // inference (no dropout)

 private:
  LayerNorm ln1_{nullptr}, ln2_{nullptr};
  CausalSelfAttention attn_{nullptr};
  MLP mlp_{nullptr};
  double dropout_;
};
TORCH_MODULE(Block);

class GPTImpl : public torch::nn::Module {
 public:
  explicit GPTImpl(const GPTConfig& c);
  // idx, targets: [B, T] int64 byte values. Returns the mean cross-entropy over all B*T tokens.
  torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets);
  torch::Tensor logits(const torch::Tensor& idx);  // [B, T, vocab]
  // Inference with a kv-cache: the logits of `idx` ([B, T] tokens at positions cache.length ..
  // cache.length + T - 1), extending the cache. Start with an empty KVCache whose `pad` gives
  // each row's left padding (zeros: none). Throws when the context would exceed block_size.
  torch::Tensor logits_cached(const torch::Tensor& idx, KVCache& cache);
  const GPTConfig& config() const { return config_; }
  int64_t num_parameters() const;

 private:
  GPTConfig config_;
  torch::nn::Embedding wte_{nullptr}, wpe_{nullptr};
  std::vector<std::shared_ptr<deepspeed::ZeroUnit<Block>>> blocks_;
  LayerNorm ln_f_{nullptr};
  torch::nn::Linear head_{nullptr};  // null with tie_embeddings (the head is wte's weight)
};
TORCH_MODULE(GPT);

}  // namespace gpt
