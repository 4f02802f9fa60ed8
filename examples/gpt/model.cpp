#include "gpt/model.h"

#include <cmath>
#include <unordered_map>

#include <torch/version.h>

#include "deepspeed/checkpointing.h"
#include "deepspeed/inference.h"
#include "deepspeed/zero_init.h"

namespace gpt {
namespace F = torch::nn::functional;

namespace {
// deepspeed::zero::linear (ZeRO-3 frees the weight between forward and backward), plus the
// all-reduce after a layer init_inference's AutoTP split by rows.
torch::Tensor linear(const torch::nn::Linear& l, const torch::Tensor& x) {
  return deepspeed::tp::linear(x, l->weight, l->bias);
}

void gpt2_init_one(torch::nn::Module& m, double linear_std) {
  if (auto* lin = m.as<torch::nn::Linear>()) {
    lin->weight.normal_(0.0, linear_std);
    if (lin->bias.defined()) lin->bias.zero_();
  } else if (auto* emb = m.as<torch::nn::Embedding>()) {
    emb->weight.normal_(0.0, 0.02);
  }
}
}  // namespace

double residual_init_std(const GPTConfig& c) {
  return c.scaled_residual_init ? 0.02 / std::sqrt(2.0 * double(c.n_layer)) : 0.02;
}

void gpt2_init(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  // `module` first, as modules(include_self=true) orders the draws: a pipeline layer may itself
  // be a Linear or an Embedding. Not through that call, which needs `module` in a shared_ptr (a
  // GPT or a block initialises itself in its constructor, before it is in one).
  std::vector<torch::nn::Module*> all{&module};
  for (auto& m : module.modules(/*include_self=*/false)) all.push_back(m.get());
  // The residual projections name themselves (each attention and MLP knows its config), so a
  // whole GPT, one pipeline layer and the unsplit block of a tensor-parallel one all get them.
  std::unordered_map<const torch::nn::Module*, double> residual;
  for (auto* m : all) {
    if (auto* attn = m->as<CausalSelfAttentionImpl>()) residual.insert(attn->residual_projection());
    if (auto* mlp = m->as<MLPImpl>()) residual.insert(mlp->residual_projection());
  }
  for (auto* m : all) {
    auto it = residual.find(m);
    gpt2_init_one(*m, it == residual.end() ? 0.02 : it->second);
  }
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GPTConfig& c)
    : head_dim_(c.n_embd / c.n_head), proj_init_std_(residual_init_std(c)) {
  TORCH_CHECK(c.n_embd % c.n_head == 0, "n_embd (", c.n_embd, ") must be divisible by n_head (",
              c.n_head, ")");
  qkv_ = register_module("qkv", torch::nn::Linear(torch::nn::LinearOptions(c.n_embd, 3 * c.n_embd).bias(c.bias)));
  proj_ = register_module("proj", torch::nn::Linear(torch::nn::LinearOptions(c.n_embd, c.n_embd).bias(c.bias)));
  mask_ = register_buffer("mask", torch::ones({c.block_size, c.block_size}).tril());
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), C = local_width(), hd = head_dim_, nh = C / hd;
  auto qkv = linear(qkv_, x).split(C, /*dim=*/2);
  auto heads = [&](const torch::Tensor& t) { return t.view({B, T, nh, hd}).transpose(1, 2); };
  auto q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);          // [B, h, T, hd]
#if TORCH_VERSION_MAJOR >= 2
  // libtorch 2.x: the fused (flash / memory-efficient) kernel; the [T, T] scores never exist.
  if (q.is_cuda()) {
    auto y = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
    return linear(proj_, y.transpose(1, 2).contiguous().view({B, T, C}));
  }
#endif
  auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(hd)));  // [B,h,T,T]
  att = att.masked_fill(mask_.slice(0, 0, T).slice(1, 0, T) == 0,
                        -std::numeric_limits<float>::infinity());
  att = torch::softmax(att, -1);
  auto y = torch::matmul(att, v).transpose(1, 2).contiguous().view({B, T, C});
  return linear(proj_, y);
}

torch::Tensor CausalSelfAttentionImpl::forward_cached(const torch::Tensor& x, torch::Tensor& k_all,
                                                     torch::Tensor& v_all, const KVCache& cache) {
  const int64_t B = x.size(0), T = x.size(1), C = local_width(), hd = head_dim_, nh = C / hd;
  auto qkv = linear(qkv_, x).split(C, /*dim=*/2);
  auto heads = [&](const torch::Tensor& t) { return t.view({B, T, nh, hd}).transpose(1, 2); };
  auto q = heads(qkv[0]);
  k_all = k_all.defined() ? torch::cat({k_all, heads(qkv[1])}, 2) : heads(qkv[1]);
  v_all = v_all.defined() ? torch::cat({v_all, heads(qkv[2])}, 2) : heads(qkv[2]);
  const int64_t L = k_all.size(2);  // positions held, these T included
  // Query i (absolute position cache.length + i) sees key j when j <= that position and j is not
  // in its row's left padding: the same masked softmax as forward(), over the held keys.
  auto opts = torch::TensorOptions().dtype(torch::kLong).device(x.device());
  auto qpos = torch::arange(cache.length, cache.length + T, opts).view({1, 1, T, 1});
  auto kpos = torch::arange(L, opts).view({1, 1, 1, L});
  // A padding query sees itself only: with no key at all its softmax would be NaN, and a NaN
  // value times a zero weight is still NaN in the real rows' sums.
  auto visible = (kpos <= qpos) & ((kpos >= cache.pad.view({B, 1, 1, 1})) | (kpos == qpos));
  auto att = torch::matmul(q, k_all.transpose(-2, -1)) * (1.0 / std::sqrt(double(hd)));
  att = torch::softmax(att.masked_fill(visible.logical_not(), -std::numeric_limits<float>::infinity()), -1);
  auto y = torch::matmul(att, v_all).transpose(1, 2).contiguous().view({B, T, C});
  return linear(proj_, y);
}

MLPImpl::MLPImpl(const GPTConfig& c)
    : gelu_tanh_(c.gelu_tanh), proj_init_std_(residual_init_std(c)) {
  fc_ = register_module("fc", torch::nn::Linear(torch::nn::LinearOptions(c.n_embd, 4 * c.n_embd).bias(c.bias)));
  proj_ = register_module("proj", torch::nn::Linear(torch::nn::LinearOptions(4 * c.n_embd, c.n_embd).bias(c.bias)));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) {
  auto h = linear(fc_, x);
  return linear(proj_, gelu_tanh_ ? torch::gelu(h, "tanh") : torch::gelu(h));
}

torch::Tensor LayerNormImpl::forward(const torch::Tensor& x) {
  if (!x.is_cpu() || x.scalar_type() != torch::kBFloat16)
    return torch::nn::LayerNormImpl::forward(x);
  auto fp32 = F::LayerNormFuncOptions(options.normalized_shape()).eps(options.eps());
  if (weight.defined()) fp32.weight(weight.to(torch::kFloat));
  if (bias.defined()) fp32.bias(bias.to(torch::kFloat));
  return F::layer_norm(x.to(torch::kFloat), fp32).to(torch::kBFloat16);
}

BlockImpl::BlockImpl(const GPTConfig& c) : dropout_(c.dropout) {
  ln1_ = register_module("ln1", LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
  attn_ = register_module("attn", CausalSelfAttention(c));
  ln2_ = register_module("ln2", LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
  mlp_ = register_module("mlp", MLP(c));
  // Under zero::Init the unit around this block partitions it as soon as it is built, before the
  // model-wide initialisation below could reach it (it skips released, empty weights).
  if (deepspeed::zero::Init::current()) gpt2_init(*this);
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  auto drop = [this](const torch::Tensor& t) {
    return dropout_ > 0 ? F::dropout(t, F::DropoutFuncOptions().p(dropout_).training(is_training()))
                        : t;
  };
  auto h = x + drop(attn_->forward(ln1_->forward(x)));
  return h + drop(mlp_->forward(ln2_->forward(h)));
}

torch::Tensor BlockImpl::forward_cached(const torch::Tensor& x, torch::Tensor& k, torch::Tensor& v,
                                       const KVCache& cache) {
  auto h = x + attn_->forward_cached(ln1_->forward(x), k, v, cache);
  return h + mlp_->forward(ln2_->forward(h));
}

GPTImpl::GPTImpl(const GPTConfig& c) : config_(c) {
  wte_ = register_module("wte", torch::nn::Embedding(c.vocab_size, c.n_embd));
  wpe_ = register_module("wpe", torch::nn::Embedding(c.block_size, c.n_embd));
  for (int64_t i = 0; i < c.n_layer; ++i)
    blocks_.push_back(register_module("block" + std::to_string(i),
                                      std::make_shared<deepspeed::ZeroUnit<Block>>(Block(c))));
  ln_f_ = register_module("ln_f", LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
  if (!c.tie_embeddings)
    head_ = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(c.n_embd, c.vocab_size).bias(false)));
  // Built in placeholders for init_inference (deepspeed::inference::DeferredInit), the weights
  // come from the checkpoint: a second pass writing every weight would only cost time.
  if (!deepspeed::inference::DeferredInit::active()) gpt2_init(*this);
}

torch::Tensor GPTImpl::logits(const torch::Tensor& idx) {
  const int64_t T = idx.size(1);
  TORCH_CHECK(T <= config_.block_size, "sequence of ", T, " tokens exceeds block_size ",
              config_.block_size);
  auto pos = torch::arange(T, torch::TensorOptions().dtype(torch::kLong).device(idx.device()));
  auto x = wte_->forward(idx) + wpe_->forward(pos);
  for (auto& b : blocks_) {
    if (config_.activation_checkpointing)
      x = deepspeed::checkpointing::checkpoint([b](const torch::Tensor& in) { return b->forward(in); }, x);
    else
      x = b->forward(x);
  }
  x = ln_f_->forward(x);
  if (config_.tie_embeddings) return deepspeed::zero::linear(x, wte_->weight, {});
  return linear(head_, x);
}

torch::Tensor GPTImpl::logits_cached(const torch::Tensor& idx, KVCache& cache) {
  const int64_t B = idx.size(0), T = idx.size(1);
  TORCH_CHECK(cache.length + T <= config_.block_size, "context of ", cache.length + T,
              " positions exceeds block_size ", config_.block_size);
  if (!cache.pad.defined()) cache.pad = torch::zeros({B}, torch::kLong);
  cache.pad = cache.pad.to(idx.device());
  cache.k.resize(blocks_.size());
  cache.v.resize(blocks_.size());
  // Positions count from each row's first real token (left padding shifts them back), so a
  // padded row computes what it would alone.
  auto abs = torch::arange(cache.length, cache.length + T,
                           torch::TensorOptions().dtype(torch::kLong).device(idx.device()));
  auto pos = (abs.view({1, T}) - cache.pad.view({B, 1})).clamp_min(0);
  auto x = wte_->forward(idx) + wpe_->forward(pos);
  for (size_t i = 0; i < blocks_.size(); ++i)
    x = blocks_[i]->inner()->forward_cached(x, cache.k[i], cache.v[i], cache);  // no stage-3 engine here
  cache.length += T;
  x = ln_f_->forward(x);
  if (config_.tie_embeddings) return deepspeed::zero::linear(x, wte_->weight, {});
  return linear(head_, x);
}

torch::Tensor GPTImpl::forward(const torch::Tensor& idx, const torch::Tensor& targets) {
  auto lg = logits(idx);
  // The loss in fp32 whatever the model dtype (bf16 logits lose digits in the log-sum-exp).
  return F::cross_entropy(lg.view({-1, lg.size(-1)}).to(torch::kFloat), targets.reshape({-1}));
}

int64_t GPTImpl::num_parameters() const {
  int64_t n = 0;
  for (auto& p : parameters()) n += p.numel();
  return n;
}

}  // namespace gpt
