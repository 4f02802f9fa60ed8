// dsrun's host selection (tools/dsrun/world.*): DeepSpeed's hostfile, --include/--exclude,
// --num_nodes/--num_procs, the world info the per-node agents get, and where each node's ranks
// sit.
#include <gtest/gtest.h>

#include <string>

#include "spawn.h"
#include "world.h"

namespace dsrun_world_test {

using namespace deepspeed::launcher;

namespace {
const char* kHostfile =
    "# two workers\n"
    "worker-0 slots=2\n"
    "\n"
    "worker-1   slots=4   # the big one\n";

std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const LaunchError& e) {
    return e.what();
  }
  return "(no error)";
}
}  // namespace

TEST(DsrunWorld, HostfileWithCommentsAndBlankLines) {
  Resources r = parse_hostfile(kHostfile, "hosts");
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].host, "worker-0");
  EXPECT_EQ(r[0].slots, (std::vector<int>{0, 1}));
  EXPECT_EQ(r[1].host, "worker-1");
  EXPECT_EQ(r[1].slots, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(world_size(r), 6);
}

TEST(DsrunWorld, BadHostfileLinesAreNamed) {
  std::string e = what_of([] { parse_hostfile("a slots=2\nb slots=x\n", "hosts"); });
  EXPECT_NE(e.find("hosts"), std::string::npos) << e;
  EXPECT_NE(e.find("2"), std::string::npos) << e;  // the line number
  EXPECT_NE(e.find("b slots=x"), std::string::npos) << e;
  e = what_of([] { parse_hostfile("a slots=0\n", "hosts"); });
  EXPECT_NE(e.find("a slots=0"), std::string::npos) << e;
  e = what_of([] { parse_hostfile("a slots=1\na slots=2\n", "hosts"); });
  EXPECT_NE(e.find("a"), std::string::npos) << e;
  EXPECT_NE(what_of([] { read_hostfile("/nonexistent/hostfile"); }).find("/nonexistent/hostfile"),
            std::string::npos);
}

// DeepSpeed's hostfile regex takes user@host; here '@' separates --include hosts, so the refusal
// says where the user name goes instead.
TEST(DsrunWorld, AUserAtHostLineSaysWhereTheUserGoes) {
  std::string e = what_of([] { parse_hostfile("setup@10.0.0.7 slots=2\n", "hosts"); });
  EXPECT_NE(e.find("hosts line 1"), std::string::npos) << e;
  EXPECT_NE(e.find("~/.ssh/config (Host 10.0.0.7 / User setup)"), std::string::npos) << e;
}

// OpenMPI-style lines (DeepSpeed's runner reads them with re.search(r'^(\S+)\s+slots=(\d+)')):
// words after slots=N are ignored; slots=N must still come right after the host.
TEST(DsrunWorld, HostfileWordsAfterSlotsAreIgnored) {
  Resources r = parse_hostfile("localhost slots=2 max_slots=2\nworker-1 slots=1 anything else\n",
                               "hosts");
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].slots, (std::vector<int>{0, 1}));
  EXPECT_EQ(r[1].slots, (std::vector<int>{0}));
  EXPECT_NE(what_of([] { parse_hostfile("a max_slots=2 slots=2\n", "hosts"); })
                .find("expected slots=N after the host name"),
            std::string::npos);
  EXPECT_NE(what_of([] { parse_hostfile("a slots=x max_slots=2\n", "hosts"); })
                .find("slots must be a whole number"),
            std::string::npos);
  EXPECT_NE(what_of([] { parse_hostfile("a\n", "hosts"); }).find("expected 'HOST slots=N'"),
            std::string::npos);
}

// Without a hostfile the pool is {localhost: slots}, and the selection works on it as on a
// hostfile's (DeepSpeed's `--include localhost:0,1`, `--num_nodes 1`).
TEST(DsrunWorld, LocalPoolWithoutHostfile) {
  Resources pool = local_pool(4);
  ASSERT_EQ(pool.size(), 1u);
  EXPECT_EQ(pool[0].host, "localhost");
  EXPECT_EQ(pool[0].slots, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(encode_world(select_resources(pool, "localhost:1,3", "", -1, -1)), "localhost:1,3");
  EXPECT_EQ(encode_world(select_resources(pool, "", "localhost:0", 1, -1)), "localhost:1,2,3");
  EXPECT_EQ(encode_world(select_resources(pool, "localhost", "", -1, 2)), "localhost:0,1");
  EXPECT_EQ(what_of([&] { select_resources(pool, "worker-1", "", -1, -1, "the pool"); }),
            "--include 'worker-1': host worker-1 is not in the pool (localhost)");
}

TEST(DsrunWorld, IncludeAndExclude) {
  Resources pool = parse_hostfile(kHostfile, "hosts");
  Resources inc = include_only(pool, "worker-0:1@worker-1", "--include");
  ASSERT_EQ(inc.size(), 2u);
  EXPECT_EQ(inc[0].slots, (std::vector<int>{1}));
  EXPECT_EQ(inc[1].slots, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(encode_world(inc), "worker-0:1@worker-1:0,1,2,3");

  Resources exc = exclude(pool, "worker-1:0,2", "--exclude");
  ASSERT_EQ(exc.size(), 2u);
  EXPECT_EQ(exc[1].slots, (std::vector<int>{1, 3}));
  EXPECT_EQ(exclude(pool, "worker-0", "--exclude").size(), 1u);

  std::string e = what_of([&] { include_only(pool, "worker-9", "--include"); });
  EXPECT_NE(e.find("--include"), std::string::npos) << e;
  EXPECT_NE(e.find("worker-9"), std::string::npos) << e;
  e = what_of([&] { include_only(pool, "worker-0:5", "--include"); });
  EXPECT_NE(e.find("5"), std::string::npos) << e;
  EXPECT_NE(what_of([&] { select_resources(pool, "worker-0", "worker-1", 0, 0); }), "(no error)");
}

TEST(DsrunWorld, NumNodesAndNumProcs) {
  Resources pool = parse_hostfile(kHostfile, "hosts");
  Resources one = select_resources(pool, "", "", 1, 0);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].host, "worker-0");
  Resources two_each = select_resources(pool, "", "", 0, 2);
  EXPECT_EQ(world_size(two_each), 4);
  EXPECT_NE(what_of([&] { select_resources(pool, "", "", 3, 0); }), "(no error)");
  EXPECT_NE(what_of([&] { select_resources(pool, "", "", 0, 3); }), "(no error)");
}

TEST(DsrunWorld, WorldInfoRoundTripsAndPlacesRanks) {
  Resources world = decode_world("hosta:0,1@hostb:0,1,2");
  EXPECT_EQ(encode_world(world), "hosta:0,1@hostb:0,1,2");
  NodePlacement p = place_node(world, 1);
  EXPECT_EQ(p.host, "hostb");
  EXPECT_EQ(p.first_rank, 2);
  EXPECT_EQ(p.local_size, 3);
  EXPECT_EQ(p.world_size, 5);
  EXPECT_EQ(p.num_nodes, 2);
  EXPECT_NE(what_of([&] { place_node(world, 2); }), "(no error)");
  EXPECT_NE(what_of([] { decode_world("hosta:x"); }).find("hosta:x"), std::string::npos);
}

}  // namespace dsrun_world_test
