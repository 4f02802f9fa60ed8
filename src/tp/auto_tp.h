// AutoTP's placement rule (deepspeed/inference.h has it in words): which Linear layers of a
// module tree are split by columns, which by rows, which stay whole. A pure function of the
// tree's structure and names; nothing is changed.
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <string>
#include <vector>

#include "deepspeed/inference.h"

namespace deepspeed {
namespace tp {

struct Placement {
  ShardedLinear layer;                      // name, kind, fused parts, full shape
  torch::nn::LinearImpl* linear = nullptr;  // the module itself
  // The LM head: a row layer whose input arrives whole (not a column layer's split output), so
  // tp::linear cuts this rank's columns of it first.
  bool whole_input = false;
};

// The blocks' Linear layers in registration (pre-)order, then the LM head (a direct child of
// `root` named lm_head, embed_out or head, not tied to another parameter), listed only when a
// block was found. Other Linear layers outside blocks are not listed (they stay whole).
std::vector<Placement> autotp_plan(torch::nn::Module& root);

// Whether `name` (a dotted module path) ends in one of AutoTP's row-parallel names / fused q/k/v
// names.
bool has_row_name(const std::string& name);
bool is_lm_head_name(const std::string& name);
bool has_fused_qkv_name(const std::string& name);

}  // namespace tp
}  // namespace deepspeed
