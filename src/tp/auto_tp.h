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
};

// In registration (pre-)order. Linear layers outside blocks are not listed (they stay whole).
std::vector<Placement> autotp_plan(torch::nn::Module& root);

// Whether `name` (a dotted module path) ends in one of AutoTP's row-parallel names / fused q/k/v
// names.
bool has_row_name(const std::string& name);
bool has_fused_qkv_name(const std::string& name);

}  // namespace tp
}  // namespace deepspeed
