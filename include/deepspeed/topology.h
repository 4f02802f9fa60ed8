// Where a rank sits in a pipe x data x tensor grid of the world, and the communicators of its
// groups (DeepSpeed's PipeDataParallelTopology / PipeModelDataParallelTopology).
//
// Rank order, as DeepSpeed's ProcessTopology with axes [pipe, data, tensor] ("model" there): the
// last axis varies fastest,
//   rank = (pipe * data_size + data) * tensor_size + tensor,
// so a tensor-parallel group is consecutive ranks (one node, where its heavy traffic belongs),
// data-parallel ranks of one pipeline stage are tensor_size apart, and pipeline stages are
// data_size * tensor_size apart. With tensor = 1 this is PipeDataParallelTopology (data
// innermost).
//
// Vocabulary: a "group" is the set of world ranks that differ only in one coordinate; its
// communicator numbers them by that coordinate (data-parallel rank = data coordinate).
#pragma once
#include <vector>

#include "deepspeed/comm.h"

namespace deepspeed {
namespace comm {

struct TopologySizes {
  int pipe = 1;    // pipeline stages
  int tensor = 1;  // tensor (model) parallel degree
  // data = world_size / (pipe * tensor)
};

struct Coordinates {
  int pipe = 0;
  int data = 0;
  int tensor = 0;
  bool operator==(const Coordinates& o) const {
    return pipe == o.pipe && data == o.data && tensor == o.tensor;
  }
};

// The layout alone: pure functions of the sizes, no communicator.
class Grid {
 public:
  // Throws ConfigError unless pipe, tensor >= 1 and pipe * tensor divides world_size.
  Grid(int world_size, TopologySizes sizes);

  int world_size() const { return pipe_ * data_ * tensor_; }
  int pipe_size() const { return pipe_; }
  int data_size() const { return data_; }
  int tensor_size() const { return tensor_; }

  Coordinates coordinates(int rank) const;
  int rank_of(const Coordinates& c) const;
  // World ranks of `rank`'s group along one axis, ordered by that axis' coordinate.
  std::vector<int> data_parallel_group(int rank) const;
  std::vector<int> pipe_parallel_group(int rank) const;
  std::vector<int> tensor_parallel_group(int rank) const;

 private:
  int pipe_, data_, tensor_;
};

// A Grid over a world communicator, with this rank's group communicators built once.
// Construction is COLLECTIVE over `world` (one split per axis whose size is neither 1 nor the
// world size; none with the default sizes). An axis of size world_size hands out `world` itself
// (so with pipe = tensor = 1 data_parallel() IS the world communicator: no new group, no extra
// traffic), an axis of size 1 a single-process communicator.
// Thread-safety: const after construction.
class Topology {
 public:
  explicit Topology(CommunicatorPtr world, TopologySizes sizes = {});

  const Grid& grid() const { return grid_; }
  Coordinates coordinates() const { return grid_.coordinates(world_->rank()); }

  const CommunicatorPtr& world() const { return world_; }
  const CommunicatorPtr& data_parallel() const { return data_; }
  const CommunicatorPtr& pipe_parallel() const { return pipe_; }
  const CommunicatorPtr& tensor_parallel() const { return tensor_; }

 private:
  Grid grid_;
  CommunicatorPtr world_, data_, pipe_, tensor_;
};

}  // namespace comm
}  // namespace deepspeed
