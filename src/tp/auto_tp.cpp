#include "tp/auto_tp.h"

#include <torch/torch.h>

#include <set>

namespace deepspeed {
namespace tp {
namespace {

std::string last_component(const std::string& name) {
  const auto dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

bool is_layer_norm(torch::nn::Module& m) { return m.as<torch::nn::LayerNorm>() != nullptr; }

bool inside(const std::string& name, const std::string& prefix) {
  return prefix.empty()
             ? !name.empty()
             : name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
                   name[prefix.size()] == '.';
}

// What a module holds: its parameters' names and shapes (equal for the layers of one stack).
std::string signature(torch::nn::Module& m) {
  std::string out;
  for (auto& p : m.named_parameters()) out += p.key() + c10::str(p.value().sizes()) + ";";
  return out;
}

std::string parent_of(const std::string& name) {
  const auto dot = name.rfind('.');
  return dot == std::string::npos ? (name.empty() ? "<none>" : "") : name.substr(0, dot);
}

// The transformer layers, as DeepSpeed finds them (the class repeated in a ModuleList): modules
// with >= 2 Linear layers and a LayerNorm below them. Those with a sibling of the same
// signature (a stack of layers) win, outermost first; with no stack (a one-layer model), the
// innermost such modules that have a LayerNorm child.
std::vector<std::string> find_blocks(torch::nn::Module& root) {
  struct Candidate {
    std::string name;
    std::string signature;
    bool norm_child = false;
  };
  std::vector<Candidate> candidates;
  for (auto& item : root.named_modules()) {
    torch::nn::Module& m = *item.value();
    int linears = 0, norms = 0;
    for (auto& d : m.modules(/*include_self=*/false)) {
      linears += d->as<torch::nn::Linear>() != nullptr;
      norms += is_layer_norm(*d);
    }
    if (linears < 2 || norms < 1) continue;
    bool norm_child = false;
    for (auto& child : m.children()) norm_child = norm_child || is_layer_norm(*child);
    candidates.push_back({item.key(), signature(m), norm_child});
  }
  auto repeated = [&](const Candidate& c) {
    for (auto& o : candidates)
      if (o.name != c.name && parent_of(o.name) == parent_of(c.name) && o.signature == c.signature)
        return true;
    return false;
  };
  std::vector<std::string> blocks;
  for (auto& c : candidates) {
    if (!repeated(c)) continue;
    bool in_stack = false;
    for (auto& o : candidates) in_stack = in_stack || (inside(c.name, o.name) && repeated(o));
    if (!in_stack) blocks.push_back(c.name);
  }
  if (!blocks.empty()) return blocks;
  for (auto& c : candidates) {
    if (!c.norm_child) continue;
    bool has_inner = false;
    for (auto& o : candidates) has_inner = has_inner || (o.norm_child && inside(o.name, c.name));
    if (!has_inner) blocks.push_back(c.name);
  }
  return blocks;
}

}  // namespace

// A name "matches" a suffix when it is the suffix or ends in "." + suffix (dotted suffixes
// name a parent too: GPT-NeoX's attention.dense is a row layer, BERT's intermediate.dense is not).
// attn.dense does not match Phi's self_attn.dense (the character before is '_'), hence its own
// entry: Phi's attention output is neither before a LayerNorm nor its layer's last Linear.
bool has_row_name(const std::string& name) {
  static const char* rows[] = {"o_proj",
                               "out_proj",
                               "dense_4h_to_h",
                               "down_proj",
                               "fc2",
                               "c_proj",
                               "wo",
                               "attention.dense",
                               "attn.dense",
                               "self_attn.dense",
                               "self_attention.dense"};
  for (const char* suffix : rows) {
    const std::string s(suffix);
    if (name == s ||
        (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0 &&
         name[name.size() - s.size() - 1] == '.'))
      return true;
  }
  return false;
}

bool has_fused_qkv_name(const std::string& name) {
  static const std::set<std::string> fused = {"qkv", "c_attn", "query_key_value", "Wqkv",
                                              "qkv_proj"};
  return fused.count(last_component(name)) > 0;
}

bool is_lm_head_name(const std::string& name) {
  return name == "lm_head" || name == "embed_out" || name == "head";
}

namespace {

// The LM head (DeepSpeed's set_lm_head: the root's lm_head or embed_out Linear; here also
// `head`, the example GPT's): split by input columns, its input cut to this rank's columns and
// the partial logits all-reduced (LmHeadLinearAllreduce). A head whose weight is registered
// under another name too (tied to the token embedding) stays whole: cutting it would cut the
// embedding (DeepSpeed gives the head a cut copy, untying it).
void plan_head(torch::nn::Module& root, std::vector<Placement>& plan) {
  for (auto& child : root.named_children()) {
    auto* lin = child.value()->as<torch::nn::Linear>();
    if (!lin || !is_lm_head_name(child.key())) continue;
    bool placed = false;  // root is itself a block (a one-layer model): placed with it
    for (const auto& p : plan) placed = placed || p.linear == lin;
    int names = 0;
    for (auto& param : root.named_parameters())
      names += param.value().unsafeGetTensorImpl() == lin->weight.unsafeGetTensorImpl();
    if (placed || names > 1) continue;
    Placement p;
    p.linear = lin;
    p.layer.name = child.key();
    p.layer.kind = ShardedLinear::kRow;
    p.layer.full_shape = lin->weight.sizes().vec();
    p.whole_input = true;
    plan.push_back(std::move(p));
  }
}

}  // namespace

std::vector<Placement> autotp_plan(torch::nn::Module& root) {
  std::vector<Placement> plan;
  for (const auto& block : find_blocks(root)) {
    // The block's LayerNorms and Linears in registration order.
    struct Item {
      std::string name;
      torch::nn::LinearImpl* linear;  // null: a LayerNorm
    };
    std::vector<Item> order;
    for (auto& item : root.named_modules()) {
      if (!inside(item.key(), block)) continue;
      if (auto* lin = item.value()->as<torch::nn::Linear>())
        order.push_back({item.key(), lin});
      else if (is_layer_norm(*item.value()))
        order.push_back({item.key(), nullptr});
    }
    int last_linear = -1;
    for (size_t i = 0; i < order.size(); ++i)
      if (order[i].linear) last_linear = static_cast<int>(i);
    for (size_t i = 0; i < order.size(); ++i) {
      if (!order[i].linear) continue;
      const bool before_norm = i + 1 < order.size() && !order[i + 1].linear;
      const bool row =
          has_row_name(order[i].name) || before_norm || static_cast<int>(i) == last_linear;
      Placement p;
      p.linear = order[i].linear;
      p.layer.name = order[i].name;
      p.layer.kind = row ? ShardedLinear::kRow : ShardedLinear::kColumn;
      p.layer.fused_parts = !row && has_fused_qkv_name(order[i].name) ? 3 : 1;
      p.layer.full_shape = p.linear->weight.sizes().vec();
      plan.push_back(std::move(p));
    }
  }
  if (!plan.empty()) plan_head(root, plan);
  return plan;
}

}  // namespace tp
}  // namespace deepspeed
