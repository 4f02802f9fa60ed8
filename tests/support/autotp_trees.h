// Module trees AutoTP was not written for, shared by the inference tests: a
// one-layer GPT-NeoX-like model (norms registered first, attention.dense a row
// layer by name) and a two-layer BERT-like one (no LayerNorm child in a layer;
// intermediate.dense a column layer, the dense layers before each LayerNorm
// rows), a two-layer Phi-like one (one LayerNorm per layer, attention and MLP
// in parallel: self_attn.dense is a row layer by its name only) and one whose
// lm_head is tied to its input embedding. Hidden size 8.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <string>

namespace dstest {

struct TreeNode : torch::nn::Module {
  std::shared_ptr<TreeNode> child(const std::string &name) {
    return register_module(name, std::make_shared<TreeNode>());
  }
  void linear(const std::string &name, int64_t in, int64_t out) {
    register_module(name, torch::nn::Linear(in, out));
  }
  void norm(const std::string &name) {
    register_module(name,
                    torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})));
  }
};

// One NeoX-like layer (layers.0): its norms first, then attention's fused
// query_key_value and dense, then the MLP; a final norm and a head named
// `head` at the root. Without post_attention_norm the layer has one LayerNorm.
inline std::shared_ptr<TreeNode> neox_layer_tree(bool post_attention_norm,
                                                 const std::string &head) {
  auto root = std::make_shared<TreeNode>();
  auto layer = root->child("layers")->child("0");
  layer->norm("input_layernorm");
  if (post_attention_norm)
    layer->norm("post_attention_layernorm");
  auto attn = layer->child("attention");
  attn->linear("query_key_value", 8, 24);
  attn->linear("dense", 8, 8);
  auto mlp = layer->child("mlp");
  mlp->linear("dense_h_to_4h", 8, 32);
  mlp->linear("dense_4h_to_h", 32, 8);
  root->norm("final_layer_norm");
  root->linear(head, 8, 16);
  return root;
}

inline std::shared_ptr<TreeNode> neox_like_tree() {
  return neox_layer_tree(/*post_attention_norm=*/true, "embed_out");
}

inline std::shared_ptr<TreeNode> bert_like_tree() {
  auto root = std::make_shared<TreeNode>();
  auto encoder = root->child("encoder");
  for (const char *name : {"layer0", "layer1"}) {
    auto l = encoder->child(name);
    auto attention = l->child("attention");
    auto self = attention->child("self");
    for (const char *n : {"query", "key", "value"})
      self->linear(n, 8, 8);
    auto out = attention->child("output");
    out->linear("dense", 8, 8);
    out->norm("LayerNorm");
    l->child("intermediate")->linear("dense", 8, 32);
    auto output = l->child("output");
    output->linear("dense", 32, 8);
    output->norm("LayerNorm");
  }
  return root;
}

// HF's PhiForCausalLM: a layer holds one LayerNorm, then q/k/v, the attention
// output self_attn.dense (neither before a LayerNorm nor the layer's last
// Linear) and the MLP fc1 / fc2; lm_head at the root.
inline std::shared_ptr<TreeNode> phi_like_tree() {
  auto root = std::make_shared<TreeNode>();
  auto layers = root->child("layers");
  for (const char *name : {"0", "1"}) {
    auto layer = layers->child(name);
    layer->norm("input_layernorm");
    auto attn = layer->child("self_attn");
    for (const char *n : {"q_proj", "k_proj", "v_proj", "dense"})
      attn->linear(n, 8, 8);
    auto mlp = layer->child("mlp");
    mlp->linear("fc1", 8, 32);
    mlp->linear("fc2", 32, 8);
  }
  root->norm("final_layernorm");
  root->linear("lm_head", 8, 16);
  return root;
}

// A module holding a given tensor as its "weight" (an embedding sharing the
// head's weight: registered under both names, as a tied head is).
struct Holder : torch::nn::Module {
  explicit Holder(const torch::Tensor &w) { register_parameter("weight", w); }
};

// A NeoX-like layer whose head, lm_head, has its weight also registered as
// embed_in.weight (GPT-2's tie: the head is the token embedding).
inline std::shared_ptr<TreeNode> tied_head_tree() {
  auto root = neox_layer_tree(/*post_attention_norm=*/false, "lm_head");
  auto head = root->named_modules()["lm_head"]->as<torch::nn::Linear>();
  root->register_module("embed_in", std::make_shared<Holder>(head->weight));
  return root;
}

} // namespace dstest
