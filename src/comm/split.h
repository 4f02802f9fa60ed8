// What every Communicator::split shares: the exchange of (color, key) and who ends up where.
#pragma once
#include <functional>
#include <string>
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

// Communicator::split for a backend whose groups rendezvous through a store: exchanges (color,
// key), and for this rank's group calls make(prefix, sub_rank, sub_world) with a prefix unique to
// this split (`seq`, the same on every rank) and color, under which the group's rendezvous keys
// live. A group of one is the single-process communicator; a negative color gets nullptr.
// COLLECTIVE over `comm`.
using MakeSubGroup =
    std::function<CommunicatorPtr(const std::string& prefix, int sub_rank, int sub_world)>;
CommunicatorPtr split_over_store(Communicator& comm, int seq, int color, int key,
                                 const MakeSubGroup& make);

}  // namespace comm
}  // namespace deepspeed
