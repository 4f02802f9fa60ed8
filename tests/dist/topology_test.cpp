// Topology: the pipe x data x tensor layout (DeepSpeed's PipeModelDataParallelTopology rank
// order) as pure functions, and the group communicators it builds over a world of threads.
#include "deepspeed/topology.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "support/expect.h"
#include "support/ranks.h"

namespace topology_test {

namespace comm = deepspeed::comm;
using comm::CommunicatorPtr;
using comm::Grid;
using comm::Topology;
using Groups = std::vector<std::vector<int>>;

namespace {

Groups all_groups(const Grid& g, std::vector<int> (Grid::*group)(int) const) {
  Groups out;
  for (int r = 0; r < g.world_size(); ++r) {
    auto members = (g.*group)(r);
    if (members.front() == r) out.push_back(members);  // once per group, by its first rank
  }
  return out;
}

int64_t sum_of_world_ranks(comm::Communicator& group, int world_rank) {
  at::Tensor t = at::full({1}, world_rank, at::kLong);
  group.all_reduce(t)->wait();
  return t.item<int64_t>();
}

int64_t sum(const std::vector<int>& v) {
  int64_t s = 0;
  for (int x : v) s += x;
  return s;
}

}  // namespace

// DeepSpeed: PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=2), axes [pipe, data,
// model]: rank = pipe*4 + data*2 + model.
TEST(Grid, MatchesDeepSpeedPipeModelDataLayout) {
  Grid g(8, {/*pipe=*/2, /*tensor=*/2});
  EXPECT_EQ(g.data_size(), 2);
  EXPECT_EQ(g.coordinates(5), (comm::Coordinates{1, 0, 1}));
  EXPECT_EQ(g.coordinates(6), (comm::Coordinates{1, 1, 0}));
  for (int r = 0; r < 8; ++r) EXPECT_EQ(g.rank_of(g.coordinates(r)), r);
  EXPECT_EQ(all_groups(g, &Grid::data_parallel_group), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(all_groups(g, &Grid::pipe_parallel_group), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(all_groups(g, &Grid::tensor_parallel_group),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
}

// DeepSpeed: PipeDataParallelTopology(num_pp=2, num_dp=3), axes [pipe, data]: data innermost.
TEST(Grid, MatchesDeepSpeedPipeDataLayout) {
  Grid g(6, {/*pipe=*/2, /*tensor=*/1});
  EXPECT_EQ(all_groups(g, &Grid::data_parallel_group), (Groups{{0, 1, 2}, {3, 4, 5}}));
  EXPECT_EQ(all_groups(g, &Grid::pipe_parallel_group), (Groups{{0, 3}, {1, 4}, {2, 5}}));
  EXPECT_EQ(g.tensor_parallel_group(4), (std::vector<int>{4}));
}

TEST(Grid, DefaultIsAllDataParallel) {
  Grid g(5, {});
  EXPECT_EQ(g.data_size(), 5);
  EXPECT_EQ(g.data_parallel_group(3), (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(g.coordinates(3), (comm::Coordinates{0, 3, 0}));
}

TEST(Grid, SizesThatDoNotDivideTheWorldAreRejected) {
  try {
    Grid(6, {/*pipe=*/4, /*tensor=*/1});
    FAIL() << "expected ConfigError";
  } catch (const deepspeed::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("divide the world size 6"), std::string::npos)
        << e.what();
  }
  // A zero pipe size (which 4 % 0 would divide by) names both sizes and the world.
  EXPECT_CONTAINS(dstest::message_of<deepspeed::ConfigError>([] { Grid(4, {0, 1}); }),
                  "pipe size 0 x tensor size 1 must be positive and divide the world size 4");
}

// Default sizes: the data-parallel group is the world communicator itself (no split, so the
// engine's traffic is unchanged), the other axes are single-process.
TEST(Topology, DefaultDataParallelIsTheWorld) {
  run_ranks(2, [](CommunicatorPtr world) {
    Topology topo(world);
    EXPECT_EQ(topo.data_parallel(), world);
    EXPECT_EQ(topo.pipe_parallel()->world_size(), 1);
    EXPECT_EQ(topo.tensor_parallel()->world_size(), 1);
    EXPECT_EQ(topo.coordinates().data, world->rank());
    // A group of one keeps the job's local rank: it chooses the rank's GPU.
    EXPECT_EQ(topo.pipe_parallel()->local_rank(), world->local_rank());
    EXPECT_EQ(topo.tensor_parallel()->local_rank(), world->local_rank());
  });
}

// Every rank's groups join exactly the world ranks the Grid lists, numbered by coordinate.
void check_topology(int world_size, comm::TopologySizes sizes) {
  run_ranks(world_size, [&](CommunicatorPtr world) {
    const int r = world->rank();
    Topology topo(world, sizes);
    const Grid& g = topo.grid();
    const comm::Coordinates c = topo.coordinates();
    struct Axis {
      const CommunicatorPtr& comm;
      std::vector<int> members;
      int coordinate;
    };
    for (const Axis& a : {Axis{topo.data_parallel(), g.data_parallel_group(r), c.data},
                          Axis{topo.pipe_parallel(), g.pipe_parallel_group(r), c.pipe},
                          Axis{topo.tensor_parallel(), g.tensor_parallel_group(r), c.tensor}}) {
      ASSERT_TRUE(a.comm);
      EXPECT_EQ(a.comm->world_size(), static_cast<int>(a.members.size()));
      EXPECT_EQ(a.comm->rank(), a.coordinate);
      EXPECT_EQ(a.members[a.coordinate], r);
      EXPECT_EQ(sum_of_world_ranks(*a.comm, r), sum(a.members)) << "rank " << r;
      // Every group keeps the job's local rank (cuda:<local_rank>), a group of one included.
      EXPECT_EQ(a.comm->local_rank(), world->local_rank()) << "rank " << r;
    }
  });
}

TEST(Topology, PipeTwoByDataTwo) { check_topology(4, {/*pipe=*/2, /*tensor=*/1}); }
TEST(Topology, DataTwoByTensorTwo) { check_topology(4, {/*pipe=*/1, /*tensor=*/2}); }
TEST(Topology, PipeTwoByDataTwoByTensorTwo) { check_topology(8, {/*pipe=*/2, /*tensor=*/2}); }
// Data-parallel size 1: the engine's group is a group of one.
TEST(Topology, TensorTwoAlone) { check_topology(2, {/*pipe=*/1, /*tensor=*/2}); }
TEST(Topology, PipeTwoByTensorTwo) { check_topology(4, {/*pipe=*/2, /*tensor=*/2}); }

}  // namespace topology_test
