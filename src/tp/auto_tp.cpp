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

// Modules with a LayerNorm child and >= 2 Linear layers below them, innermost only.
std::vector<std::string> find_blocks(torch::nn::Module& root) {
  std::vector<std::string> candidates;
  for (auto& item : root.named_modules()) {
    torch::nn::Module& m = *item.value();
    bool has_norm = false;
    for (auto& child : m.children()) has_norm = has_norm || is_layer_norm(*child);
    if (!has_norm) continue;
    int linears = 0;
    for (auto& d : m.modules(/*include_self=*/false))
      linears += d->as<torch::nn::Linear>() != nullptr;
    if (linears >= 2) candidates.push_back(item.key());
  }
  std::vector<std::string> blocks;
  for (auto& c : candidates) {
    bool has_inner = false;
    for (auto& other : candidates) has_inner = has_inner || inside(other, c);
    if (!has_inner) blocks.push_back(c);
  }
  return blocks;
}

}  // namespace

bool has_row_name(const std::string& name) {
  static const std::set<std::string> rows = {
      "o_proj", "out_proj", "dense_4h_to_h", "down_proj", "fc2", "c_proj", "wo", "dense"};
  return rows.count(last_component(name)) > 0;
}

bool has_fused_qkv_name(const std::string& name) {
  static const std::set<std::string> fused = {"qkv", "c_attn", "query_key_value", "Wqkv",
                                              "qkv_proj"};
  return fused.count(last_component(name)) > 0;
}

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
  return plan;
}

}  // namespace tp
}  // namespace deepspeed
