#include "gpt/tp_model.h"

#include <cmath>
#include <limits>

#include "deepspeed/checkpointing.h"

namespace gpt {
namespace tp = deepspeed::tp;
using deepspeed::comm::CommunicatorPtr;

namespace {
// The layers' options (a braced list cannot pass through TORCH_MODULE's forwarding constructor).
tp::ColumnParallelLinearOptions column(int64_t in, int64_t out, bool bias, int fused_parts = 1) {
  tp::ColumnParallelLinearOptions o;
  o.in_features = in;
  o.out_features = out;
  o.bias = bias;
  o.fused_parts = fused_parts;
  return o;
}
tp::RowParallelLinearOptions row(int64_t in, int64_t out, bool bias) {
  tp::RowParallelLinearOptions o;
  o.in_features = in;
  o.out_features = out;
  o.bias = bias;
  return o;
}
}  // namespace

void check_tensor_parallel(const GPTConfig& c, int n, bool split_vocabulary) {
  auto refuse = [n](const std::string& what, int64_t value) {
    throw deepspeed::ConfigError("--tensor_parallel " + std::to_string(n) + " does not divide " +
                                 what + " (" + std::to_string(value) + ")");
  };
  if (n < 1)
    throw deepspeed::ConfigError("--tensor_parallel must be >= 1, got " + std::to_string(n));
  if (c.n_head % n) refuse("--n_head", c.n_head);
  if (c.n_embd % n) refuse("--n_embd", c.n_embd);
  // Training splits the vocabulary (VocabParallelEmbedding, the head by columns); inference
  // keeps the embedding whole and cuts the head by its input columns.
  if (split_vocabulary && c.vocab_size % n) refuse("the vocabulary size", c.vocab_size);
}

// The residual dropout follows the row layers' all-reduce, on activations every tensor rank holds
// whole: each rank must draw the same mask (Megatron seeds its default generator alike across a
// tensor group for the same reason), or the replicas silently diverge. Asked once per block, on
// its first training forward, with the default generator's state.
void check_same_rng_state(const CommunicatorPtr& g, const at::Tensor& generator_state) {
  const at::Tensor state = generator_state.to(at::kInt);
  at::Tensor high = state.clone(), low = state.clone();
  g->all_reduce(high, deepspeed::comm::ReduceOp::Max)->wait();
  g->all_reduce(low, deepspeed::comm::ReduceOp::Min)->wait();
  if (!torch::equal(high, low))
    throw deepspeed::ConfigError(
        "--dropout with --tensor_parallel " + std::to_string(g->world_size()) +
        ": the tensor ranks' random generators differ, so their dropout masks would too; seed "
        "every process alike (torch::manual_seed) and draw the same numbers on each before "
        "training");
}

class TPAttentionImpl : public torch::nn::Module {
 public:
  TPAttentionImpl(const GPTConfig& c, const CommunicatorPtr& g)
      : heads_(c.n_head / g->world_size()), head_dim_(c.n_embd / c.n_head) {
    qkv_ = register_module(
        "qkv",
        tp::ColumnParallelLinear(column(c.n_embd, 3 * c.n_embd, c.bias, /*fused_parts=*/3), g));
    proj_ = register_module("proj", tp::RowParallelLinear(row(c.n_embd, c.n_embd, c.bias), g));
    mask_ = register_buffer("mask", torch::ones({c.block_size, c.block_size}).tril());
  }
  // The unsplit attention on this rank's heads: [B, T, C] -> [B, T, C] (after the row layer's
  // all-reduce every head contributed).
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t B = x.size(0), T = x.size(1), local = heads_ * head_dim_;
    auto qkv = qkv_->forward(x).split(local, 2);
    auto h = [&](const torch::Tensor& t) {
      return t.view({B, T, heads_, head_dim_}).transpose(1, 2);
    };
    auto att = torch::matmul(h(qkv[0]), h(qkv[1]).transpose(-2, -1)) *
               (1.0 / std::sqrt(double(head_dim_)));
    att = att.masked_fill(mask_.slice(0, 0, T).slice(1, 0, T) == 0,
                          -std::numeric_limits<float>::infinity());
    auto y = torch::matmul(torch::softmax(att, -1), h(qkv[2])).transpose(1, 2).contiguous();
    return proj_->forward(y.view({B, T, local}));
  }

 private:
  int64_t heads_, head_dim_;
  tp::ColumnParallelLinear qkv_{nullptr};
  tp::RowParallelLinear proj_{nullptr};
  torch::Tensor mask_;
};

class TPMLPImpl : public torch::nn::Module {
 public:
  TPMLPImpl(const GPTConfig& c, const CommunicatorPtr& g) : gelu_tanh_(c.gelu_tanh) {
    fc_ =
        register_module("fc", tp::ColumnParallelLinear(column(c.n_embd, 4 * c.n_embd, c.bias), g));
    proj_ = register_module("proj", tp::RowParallelLinear(row(4 * c.n_embd, c.n_embd, c.bias), g));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = fc_->forward(x);
    return proj_->forward(gelu_tanh_ ? torch::gelu(h, "tanh") : torch::gelu(h));
  }

 private:
  bool gelu_tanh_;
  tp::ColumnParallelLinear fc_{nullptr};
  tp::RowParallelLinear proj_{nullptr};
};

TPBlockImpl::TPBlockImpl(const GPTConfig& c, const CommunicatorPtr& g)
    : dropout_(c.dropout), group_(g) {
  ln1_ = register_module("ln1", LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
  attn_ = register_module("attn", std::make_shared<TPAttentionImpl>(c, g));
  ln2_ = register_module("ln2", LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
  mlp_ = register_module("mlp", std::make_shared<TPMLPImpl>(c, g));
}

torch::Tensor TPBlockImpl::forward(const torch::Tensor& x) {
  const bool drop = dropout_ > 0 && is_training();
  if (drop && !rng_checked_) {
    check_same_rng_state(group_, at::detail::getDefaultCPUGenerator().get_state());
    rng_checked_ = true;
  }
  auto dropped = [&](const torch::Tensor& t) {
    return drop ? torch::dropout(t, dropout_, /*train=*/true) : t;
  };
  auto h = x + dropped(attn_->forward(ln1_->forward(x)));
  return h + dropped(mlp_->forward(ln2_->forward(h)));
}

TPGPTImpl::TPGPTImpl(const GPTConfig& c, CommunicatorPtr group)
    : config_(c), group_(std::move(group)) {
  check_tensor_parallel(c, group_->world_size());
  wte_ = register_module("wte", tp::VocabParallelEmbedding(c.vocab_size, c.n_embd, group_));
  wpe_ = register_module("wpe", torch::nn::Embedding(c.block_size, c.n_embd));
  for (int64_t i = 0; i < c.n_layer; ++i)
    blocks_.push_back(register_module(
        "block" + std::to_string(i),
        std::make_shared<deepspeed::ZeroUnit<TPBlock>>(TPBlock(c, group_))));
  ln_f_ = register_module("ln_f", LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
  if (!c.tie_embeddings)
    head_ = register_module(
        "head", tp::ColumnParallelLinear(column(c.n_embd, c.vocab_size, false), group_));
}

torch::Tensor TPGPTImpl::logits_split(const torch::Tensor& idx) {
  const int64_t T = idx.size(1);
  TORCH_CHECK(T <= config_.block_size, "sequence of ", T, " tokens exceeds block_size ",
              config_.block_size);
  auto pos = torch::arange(T, torch::TensorOptions().dtype(torch::kLong).device(idx.device()));
  auto x = wte_->forward(idx) + wpe_->forward(pos);
  for (auto& b : blocks_) {
    // A checkpointed block's input is the replicated residual stream: what
    // partition_activations splits over the group.
    if (config_.activation_checkpointing)
      x = deepspeed::checkpointing::checkpoint(
          [b](const torch::Tensor& in) { return b->forward(in); }, x);
    else
      x = b->forward(x);
  }
  x = ln_f_->forward(x);
  // Tied: the embedding's rows are this rank's columns of the head (a column layer).
  if (config_.tie_embeddings)
    return torch::nn::functional::linear(tp::copy_to_region(x, group_), wte_->weight);
  return head_->forward(x);
}

torch::Tensor TPGPTImpl::forward(const torch::Tensor& idx, const torch::Tensor& targets) {
  auto lg = logits_split(idx);
  const at::Tensor flat_targets = targets.reshape({-1});
  const at::Tensor losses =
      tp::vocab_parallel_cross_entropy(lg.reshape({-1, lg.size(-1)}), flat_targets, group_);
  // The mean over the tokens not ignored (-100), as F::cross_entropy's in the unsplit GPT.
  return losses.sum() / flat_targets.ne(-100).sum().clamp_min(1);
}

void TPGPTImpl::copy_from(torch::nn::Module& full) { copy_slices(*this, full); }

void copy_slices(torch::nn::Module& split, torch::nn::Module& full) {
  torch::NoGradGuard no_grad;
  auto whole = full.named_parameters();
  auto get = [&](const std::string& name) -> at::Tensor {
    if (auto* t = whole.find(name)) return *t;
    throw deepspeed::ConfigError("gpt::copy_slices: the unsplit model has no parameter " + name);
  };
  auto maybe = [&](const std::string& name) -> at::Tensor {
    auto* t = whole.find(name);
    return t ? *t : at::Tensor();
  };
  for (auto& item : split.named_modules()) {
    const std::string prefix = item.key().empty() ? "" : item.key() + ".";
    torch::nn::Module& m = *item.value();
    if (auto* col = dynamic_cast<tp::ColumnParallelLinearImpl*>(&m)) {
      col->set_from_full(get(prefix + "weight"), maybe(prefix + "bias"));
    } else if (auto* row = dynamic_cast<tp::RowParallelLinearImpl*>(&m)) {
      row->set_from_full(get(prefix + "weight"), maybe(prefix + "bias"));
    } else if (auto* emb = dynamic_cast<tp::VocabParallelEmbeddingImpl*>(&m)) {
      emb->set_from_full(get(prefix + "weight"));
    } else {
      for (auto& p : m.named_parameters(/*recurse=*/false)) p.value().copy_(get(prefix + p.key()));
    }
  }
}

}  // namespace gpt
