#include "zero/flat_groups.h"

#include <torch/optim/optimizer.h>

#include <algorithm>
#include <string>
#include <unordered_map>

#include "deepspeed/errors.h"
#include "zero/stage.h"

namespace deepspeed {
namespace zero {

std::vector<GroupSegment> group_segments(const std::vector<StateFragment>& fragments,
                                         const std::vector<int>& group_of,
                                         int64_t partition_numel) {
  std::vector<const StateFragment*> pieces;
  for (const auto& f : fragments)
    if (f.numel > 0) pieces.push_back(&f);
  std::sort(pieces.begin(), pieces.end(),
            [](const StateFragment* a, const StateFragment* b) { return a->at < b->at; });
  std::vector<GroupSegment> out;
  if (partition_numel <= 0) return out;
  for (const StateFragment* f : pieces) {
    const int group = group_of.at(f->param);
    if (!out.empty() && out.back().group == group) continue;  // extended below
    if (out.empty()) {
      out.push_back({0, 0, group});  // leading padding joins the first piece
    } else {
      out.push_back({f->at, 0, group});
    }
  }
  if (out.empty()) return {{0, partition_numel, 0}};
  // Each segment runs up to the next one's begin (its padding with it); the last to the end.
  for (size_t k = 0; k < out.size(); ++k)
    out[k].numel = (k + 1 < out.size() ? out[k + 1].begin : partition_numel) - out[k].begin;
  return out;
}

std::vector<int> group_of_tensors(const std::vector<std::vector<at::Tensor>>& groups,
                                  const std::vector<at::Tensor>& trainable,
                                  const std::string& what, const std::string& missing_rule,
                                  const std::vector<std::string>& names) {
  const auto name_of = [&names](size_t k) {
    return k < names.size() ? " (" + names[k] + ")" : std::string();
  };
  std::unordered_map<const void*, size_t> index;
  for (size_t k = 0; k < trainable.size(); ++k) index[trainable[k].unsafeGetTensorImpl()] = k;
  std::vector<int> group_of(trainable.size(), -1);
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const auto& p : groups[g]) {
      auto it = index.find(p.unsafeGetTensorImpl());
      if (it == index.end())
        throw ConfigError(what + " parameter group " + std::to_string(g) +
                          " holds a tensor that is not a trainable parameter of the model (a "
                          "frozen or foreign one); build the groups over the model's parameters "
                          "that require grad");
      int& slot = group_of[it->second];
      // (Twice in one group is harmless: the group steps the partition's elements once.)
      if (slot >= 0 && slot != static_cast<int>(g))
        throw ConfigError(what + ": a parameter" + name_of(it->second) +
                          " is in parameter groups " + std::to_string(slot) + " and " +
                          std::to_string(g) + "; give each parameter one group");
      slot = static_cast<int>(g);
    }
  }
  const auto missing = std::find(group_of.begin(), group_of.end(), -1);
  if (missing != group_of.end()) {
    const auto held = trainable.size() - std::count(group_of.begin(), group_of.end(), -1);
    throw ConfigError(what + " holds " + std::to_string(held) + " of the " +
                      std::to_string(trainable.size()) +
                      " trainable parameters in its parameter groups" +
                      (names.empty() ? std::string()
                                     : ", not " + names[missing - group_of.begin()]) +
                      "; " + missing_rule +
                      " (freeze a parameter with requires_grad(false) instead)");
  }
  return group_of;
}

std::vector<int> client_group_of(torch::optim::Optimizer& client,
                                 const std::vector<at::Tensor>& trainable) {
  std::vector<std::vector<at::Tensor>> groups;
  for (const auto& group : client.param_groups()) groups.push_back(group.params());
  return group_of_tensors(groups, trainable, "InitializeArgs.optimizer",
                          "under ZeRO (and fp16/bf16) it must hold all of them");
}

std::vector<std::vector<at::Tensor>> group_views(const at::Tensor& master,
                                                 const std::vector<GroupSegment>& segments,
                                                 int count) {
  std::vector<std::vector<at::Tensor>> views(count);
  for (const auto& s : segments) views.at(s.group).push_back(master.narrow(0, s.begin, s.numel));
  return views;
}

}  // namespace zero
}  // namespace deepspeed
