// A client optimizer's parameter groups over a rank's fp32 partition. The stages keep their flat
// layout (FlatParams, stage 3's units): a group's elements are not moved together. Instead the
// partition is cut into segments, each a run of elements of one group, and each group steps
// the views of the master over its segments (DeepSpeed builds one flat partition per group;
// the arithmetic per element is the same, only the memory layout differs).
#pragma once
#include <ATen/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace torch {
namespace optim {
class Optimizer;
}
}  // namespace torch

namespace deepspeed {
namespace zero {

struct StateFragment;

// Elements [begin, begin + numel) of the partition belong to parameter group `group`.
struct GroupSegment {
  int64_t begin = 0;
  int64_t numel = 0;
  int group = 0;
};

// The segments covering [0, partition_numel) of a partition whose parameter pieces are
// `fragments` (StateFragment::at places each; param indexes `group_of`). Padding between or
// before pieces joins the segment before it (the first one for leading padding); neighbouring
// segments of one group are merged. A partition holding no piece is one segment of group 0.
std::vector<GroupSegment> group_segments(const std::vector<StateFragment>& fragments,
                                         const std::vector<int>& group_of,
                                         int64_t partition_numel);

// The client's groups as group_of[k] for trainable parameter k. Throws ConfigError (naming
// InitializeArgs.optimizer) when a group holds a tensor that is not a trainable parameter of the
// model (a frozen or foreign one), a parameter is in two groups, or one is in none.
std::vector<int> client_group_of(torch::optim::Optimizer& client,
                                 const std::vector<at::Tensor>& trainable);

// The same checks over groups given as tensor lists (groups[g]: group g's tensors), naming
// `what` and the group index; `missing_rule` ends the message for parameters in no group.
// `names` (optional, parallel to `trainable`) name the parameter at fault where one is.
std::vector<int> group_of_tensors(const std::vector<std::vector<at::Tensor>>& groups,
                                  const std::vector<at::Tensor>& trainable,
                                  const std::string& what, const std::string& missing_rule,
                                  const std::vector<std::string>& names = {});

// Per group, the views of `master` (1-D) over its segments, in partition order.
std::vector<std::vector<at::Tensor>> group_views(const at::Tensor& master,
                                                 const std::vector<GroupSegment>& segments,
                                                 int count);

}  // namespace zero
}  // namespace deepspeed
