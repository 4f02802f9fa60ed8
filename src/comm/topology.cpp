#include "deepspeed/topology.h"

#include <fmt/format.h>

#include "comm/single_process.h"

namespace deepspeed {
namespace comm {
namespace {

// The communicator of one axis' group: the world when the axis spans it, alone when the axis
// has size 1 (no split, so no collective; but a member of the world's stats family as a split
// group of one is: it keeps latencies when the world does and the comms_logger counts it), else
// one split (color = the group's index among that axis' groups, key = the coordinate along the
// axis, so sub-rank = coordinate).
CommunicatorPtr axis_group(const CommunicatorPtr& world, int axis_size, int color, int key) {
  if (axis_size == world->world_size()) return world;
  if (axis_size == 1) return make_group_of_one(*world);
  return world->split(color, key);
}

}  // namespace

Grid::Grid(int world_size, TopologySizes sizes) : pipe_(sizes.pipe), tensor_(sizes.tensor) {
  if (pipe_ < 1 || tensor_ < 1 || world_size % (pipe_ * tensor_) != 0) {
    throw ConfigError(fmt::format(
        "topology: pipe size {} x tensor size {} must be positive and divide the world size {}",
        pipe_, tensor_, world_size));
  }
  data_ = world_size / (pipe_ * tensor_);
}

Coordinates Grid::coordinates(int rank) const {
  if (rank < 0 || rank >= world_size())
    throw CommError(fmt::format("topology: rank {} is not in [0, {})", rank, world_size()));
  Coordinates c;
  c.tensor = rank % tensor_;
  c.data = (rank / tensor_) % data_;
  c.pipe = rank / (tensor_ * data_);
  return c;
}

int Grid::rank_of(const Coordinates& c) const {
  return (c.pipe * data_ + c.data) * tensor_ + c.tensor;
}

std::vector<int> Grid::data_parallel_group(int rank) const {
  Coordinates c = coordinates(rank);
  std::vector<int> ranks;
  for (c.data = 0; c.data < data_; ++c.data) ranks.push_back(rank_of(c));
  return ranks;
}

std::vector<int> Grid::pipe_parallel_group(int rank) const {
  Coordinates c = coordinates(rank);
  std::vector<int> ranks;
  for (c.pipe = 0; c.pipe < pipe_; ++c.pipe) ranks.push_back(rank_of(c));
  return ranks;
}

std::vector<int> Grid::tensor_parallel_group(int rank) const {
  Coordinates c = coordinates(rank);
  std::vector<int> ranks;
  for (c.tensor = 0; c.tensor < tensor_; ++c.tensor) ranks.push_back(rank_of(c));
  return ranks;
}

Topology::Topology(CommunicatorPtr world, TopologySizes sizes)
    : grid_(world ? world->world_size() : 1, sizes), world_(std::move(world)) {
  if (!world_) throw CommError("topology: no world communicator");
  const Coordinates c = coordinates();
  const int p = grid_.pipe_size(), d = grid_.data_size(), t = grid_.tensor_size();
  // Every rank builds the three axes in this order: the splits pair up across ranks.
  data_ = axis_group(world_, d, c.pipe * t + c.tensor, c.data);
  pipe_ = axis_group(world_, p, c.data * t + c.tensor, c.pipe);
  tensor_ = axis_group(world_, t, c.pipe * d + c.data, c.tensor);
}

}  // namespace comm
}  // namespace deepspeed
