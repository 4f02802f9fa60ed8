#include "comm/split.h"

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 10+ keeps it there)
#include <torch/torch.h>

#include <algorithm>
#include <set>

#include "comm/single_process.h"

namespace deepspeed {
namespace comm {

std::vector<std::pair<int, int>> exchange_color_key(Communicator& comm, int color, int key) {
  at::Tensor mine = torch::tensor({static_cast<int64_t>(color), static_cast<int64_t>(key)},
                                  torch::kLong);
  at::Tensor all = torch::empty({2 * comm.world_size()}, torch::kLong);
  comm.all_gather(all, mine)->wait();
  std::vector<std::pair<int, int>> out;
  auto a = all.accessor<int64_t, 1>();
  for (int r = 0; r < comm.world_size(); ++r)
    out.emplace_back(static_cast<int>(a[2 * r]), static_cast<int>(a[2 * r + 1]));
  return out;
}

std::vector<int> split_members(const std::vector<std::pair<int, int>>& color_key, int color) {
  std::vector<int> members;
  for (int r = 0; r < static_cast<int>(color_key.size()); ++r)
    if (color_key[r].first == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    return color_key[a].second < color_key[b].second;
  });
  return members;
}

int index_in(const std::vector<int>& members, int rank) {
  auto it = std::find(members.begin(), members.end(), rank);
  if (it == members.end())
    throw CommError(fmt::format("split: rank {} is not among the members [{}]", rank,
                                fmt::join(members, ", ")));
  return static_cast<int>(it - members.begin());
}

CommunicatorPtr split_over_store(Communicator& comm, int seq, int color, int key,
                                 const MakeSubGroup& make) {
  auto color_key = exchange_color_key(comm, color, key);
  if (color < 0) return nullptr;
  const std::vector<int> members = split_members(color_key, color);
  const int sub_world = static_cast<int>(members.size());
  if (sub_world == 1) return make_single_process_communicator(comm.local_rank());
  // Groups of one split differ by color, successive splits by seq: each rendezvous has its own
  // keys, under the parent's prefix (so nested splits stay apart too).
  return make(fmt::format("split{}/{}", seq, color), index_in(members, comm.rank()), sub_world);
}

CommunicatorPtr new_group(Communicator& comm, const std::vector<int>& ranks) {
  std::set<int> seen;
  for (int r : ranks) {
    if (r < 0 || r >= comm.world_size() || !seen.insert(r).second)
      throw CommError(fmt::format(
          "new_group on rank {} of {}: ranks [{}] must be distinct and in [0, {})", comm.rank(),
          comm.world_size(), fmt::join(ranks, ", "), comm.world_size()));
  }
  if (!seen.count(comm.rank())) return comm.split(-1, 0);
  // Members are numbered in the order of their ranks in `comm`, whatever the list's order, as
  // torch.distributed.new_group sorts its list: code ported from it broadcasting from group
  // rank 0 means the lowest listed rank.
  return comm.split(0, comm.rank());
}

}  // namespace comm
}  // namespace deepspeed
