// What every Communicator::split shares: the exchange of (color, key) and who ends up where.
#pragma once
#include <utility>
#include <vector>

#include "deepspeed/comm.h"

namespace deepspeed {
namespace comm {

// (color, key) of every rank of `comm`, indexed by rank: one all_gather of two int64 per rank.
// COLLECTIVE over `comm`.
std::vector<std::pair<int, int>> exchange_color_key(Communicator& comm, int color, int key);

// The ranks (of the parent) whose color is `color`, ordered by (key, parent rank): member i of
// the list becomes rank i of the sub-communicator.
std::vector<int> split_members(const std::vector<std::pair<int, int>>& color_key, int color);

// Index of `rank` in `members`; throws CommError if absent.
int index_in(const std::vector<int>& members, int rank);

}  // namespace comm
}  // namespace deepspeed
