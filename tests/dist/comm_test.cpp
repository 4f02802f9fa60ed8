// Collectives over Gloo with ranks as threads (support/ranks.h), swept over world sizes 2-4,
// element counts 0, 1, 7 and 1000003 (a prime: no even split anywhere), and the dtypes the
// engine moves. Values are small integers so every dtype represents sums exactly; bit-exact
// movement of bf16 is checked separately with random bits.
#include "deepspeed/comm.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <c10/core/CPUAllocator.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <vector>

#include "comm/gloo_communicator.h"
#include "support/comm_patterns.h"
#include "support/expect.h"
#include "support/ranks.h"
#include "support/scoped_env.h"
#include "util/torch_compat.h"

namespace comm_test {

namespace comm = deepspeed::comm;
using comm::CommunicatorPtr;
using comm::ReduceOp;

namespace {

const std::vector<int64_t> kCounts = {0, 1, 7, 1000003};
const std::vector<at::ScalarType> kTypes = {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf,
                                            at::kLong};
// At the large count only the dtypes the engine moves in bulk, to keep the suite fast.
const std::vector<at::ScalarType> kBulkTypes = {at::kFloat, at::kBFloat16};

using dstest::expected_reduce;
using dstest::pattern;

std::string what(at::ScalarType type, int64_t n, int rank) {
  return std::string(c10::toString(type)) + " n=" + std::to_string(n) + " rank " +
         std::to_string(rank);
}

void check_all_reduce(comm::Communicator& c, int64_t n, at::ScalarType type) {
  std::vector<ReduceOp> ops = {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min};
  if (at::isFloatingType(type)) ops.push_back(ReduceOp::Avg);
  for (ReduceOp op : ops) {
    at::Tensor t = pattern(n, c.rank(), type);
    c.all_reduce(t, op)->wait();
    EXPECT_EQ(t.scalar_type(), type);
    EXPECT_TRUE(t.equal(expected_reduce(n, c.world_size(), type, op)))
        << "all_reduce op " << static_cast<int>(op) << " " << what(type, n, c.rank());
  }
}

void check_broadcast(comm::Communicator& c, int64_t n, at::ScalarType type) {
  for (int root = 0; root < c.world_size(); ++root) {
    at::Tensor t = pattern(n, c.rank(), type, root);
    c.broadcast(t, root)->wait();
    EXPECT_TRUE(t.equal(pattern(n, root, type, root)))
        << "broadcast root " << root << " " << what(type, n, c.rank());
  }
}

void check_all_gather(comm::Communicator& c, int64_t n, at::ScalarType type) {
  at::Tensor in = pattern(n, c.rank(), type);
  at::Tensor out = at::full({c.world_size() * n}, 99, at::TensorOptions().dtype(type));
  c.all_gather(out, in)->wait();
  for (int r = 0; r < c.world_size(); ++r) {
    EXPECT_TRUE(out.narrow(0, r * n, n).equal(pattern(n, r, type)))
        << "all_gather slice " << r << " " << what(type, n, c.rank());
  }
}

void check_reduce_scatter(comm::Communicator& c, int64_t n, at::ScalarType type) {
  const int w = c.world_size();
  std::vector<ReduceOp> ops = {ReduceOp::Sum, ReduceOp::Max};
  if (at::isFloatingType(type)) ops.push_back(ReduceOp::Avg);
  for (ReduceOp op : ops) {
    at::Tensor in = pattern(w * n, c.rank(), type);
    at::Tensor out = at::empty({n}, in.options());
    c.reduce_scatter(out, in, op)->wait();
    EXPECT_TRUE(out.equal(expected_reduce(n, w, type, op, c.rank() * n)))
        << "reduce_scatter op " << static_cast<int>(op) << " " << what(type, n, c.rank());
  }
}

// Each rank sends to the next and receives from the previous one.
void check_ring(comm::Communicator& c, int64_t n, at::ScalarType type) {
  const int w = c.world_size();
  const int next = (c.rank() + 1) % w, prev = (c.rank() + w - 1) % w;
  at::Tensor out = pattern(n, c.rank(), type, 3);
  at::Tensor in = at::zeros({n}, out.options());
  auto sent = c.send(out, next, 5);
  c.recv(in, prev, 5)->wait();
  sent->wait();
  EXPECT_TRUE(in.equal(pattern(n, prev, type, 3))) << "ring " << what(type, n, c.rank());
}

void sweep(int world) {
  run_ranks(world, [](CommunicatorPtr c) {
    for (int64_t n : kCounts) {
      for (at::ScalarType type : n > 1000 ? kBulkTypes : kTypes) {
        check_all_reduce(*c, n, type);
        check_broadcast(*c, n, type);
        check_all_gather(*c, n, type);
        check_reduce_scatter(*c, n, type);
        check_ring(*c, n, type);
        c->barrier();
      }
    }
  });
}

}  // namespace

TEST(CommSweep, WorldSize2) { sweep(2); }
TEST(CommSweep, WorldSize3) { sweep(3); }
TEST(CommSweep, WorldSize4) { sweep(4); }
// On one host small all-reduces, reduce_scatter_v and all-gathers go through shared memory by
// default (shm_allreduce.h): the same sweep over Gloo alone.
TEST(CommSweep, WorldSize3WithoutSharedMemory) {
  dstest::ScopedEnv off("DS_SHM_ALLREDUCE", "0");
  sweep(3);
}

// bf16 and int16 travel as Half bits: every bit pattern must arrive unchanged, NaNs included.
TEST(Comm, SixteenBitTypesMoveBitExact) {
  run_ranks(3, [](CommunicatorPtr c) {
    const int64_t n = 65536;  // every 16-bit pattern once
    at::Tensor bits = at::arange(n, at::kInt).sub(32768).to(at::kShort);
    for (at::ScalarType type : {at::kBFloat16, at::kShort}) {
      at::Tensor all = type == at::kShort ? bits.clone() : bits.view(at::kBFloat16).clone();
      at::Tensor mine = c->rank() == 1 ? all.clone() : at::zeros({n}, all.options());
      c->broadcast(mine, 1)->wait();
      EXPECT_TRUE(mine.view(at::kShort).equal(bits)) << c10::toString(type);
      at::Tensor gathered = at::zeros({3 * n}, all.options());
      c->all_gather(gathered, all)->wait();
      EXPECT_TRUE(gathered.view(at::kShort).narrow(0, 2 * n, n).equal(bits));
    }
  });
}

// bf16 all_reduce sums in fp32 and rounds once. Per element one rank (a different one each
// position) contributes 256 and the others 1: the fp32 sum 259 rounds to 260 in bf16, while any
// bf16 running sum that adds a 1 to 256 rounds back to 256 (bf16 spacing is 2 there).
TEST(Comm, Bf16AllReduceSumsInFp32) {
  run_ranks(4, [](CommunicatorPtr c) {
    at::Tensor big_here = at::arange(1000, at::kLong).remainder(4).eq(c->rank());
    at::Tensor t =
        at::where(big_here, at::scalar_tensor(256.0), at::scalar_tensor(1.0)).to(at::kBFloat16);
    c->all_reduce(t)->wait();
    EXPECT_TRUE(t.equal(at::full({1000}, 260.0, at::kBFloat16)));
  });
}

TEST(Comm, NonContiguousTensorsAreStagedAndCopiedBack) {
  run_ranks(2, [](CommunicatorPtr c) {
    at::Tensor base = pattern(12, c->rank(), at::kBFloat16).view({3, 4});
    at::Tensor t = base.t();  // a strided view
    ASSERT_FALSE(t.is_contiguous());
    c->all_reduce(t)->wait();
    EXPECT_TRUE(base.equal(expected_reduce(12, 2, at::kBFloat16, ReduceOp::Sum).view({3, 4})));
    at::Tensor f = pattern(12, c->rank(), at::kFloat).view({3, 4}).t();
    c->broadcast(f, 1)->wait();
    EXPECT_TRUE(f.equal(pattern(12, 1, at::kFloat).view({3, 4}).t()));
  });
}

// ZeRO gathers a flat buffer from the partition that lives inside it, and reduce-scatters into a
// slice of the buffer it reads: both must work when input and output alias.
TEST(Comm, GatherAndReduceScatterInPlace) {
  run_ranks(3, [](CommunicatorPtr c) {
    const int64_t n = 1001;
    at::Tensor flat = at::zeros({3 * n}, at::kBFloat16);
    at::Tensor mine = flat.narrow(0, c->rank() * n, n);
    mine.copy_(pattern(n, c->rank(), at::kBFloat16));
    c->all_gather(flat, mine)->wait();
    for (int r = 0; r < 3; ++r)
      EXPECT_TRUE(flat.narrow(0, r * n, n).equal(pattern(n, r, at::kBFloat16)));

    at::Tensor grads = pattern(3 * n, c->rank(), at::kFloat);
    at::Tensor slice = grads.narrow(0, c->rank() * n, n);
    c->reduce_scatter(slice, grads)->wait();
    EXPECT_TRUE(slice.equal(expected_reduce(n, 3, at::kFloat, ReduceOp::Sum, c->rank() * n)));
  });
}

TEST(Comm, StatsCountCallsAndBytes) {
  run_ranks(2, [](CommunicatorPtr c) {
    c->reset_stats();
    at::Tensor a = at::ones({1000});
    c->all_reduce(a)->wait();
    c->all_reduce(a)->wait();
    at::Tensor h = at::ones({10}, at::kBFloat16), out = at::empty({20}, at::kBFloat16);
    c->all_gather(out, h)->wait();
    at::Tensor rs_out = at::empty({10}, at::kBFloat16);
    c->reduce_scatter(rs_out, out)->wait();
    c->broadcast(a, 0)->wait();
    c->barrier();
    comm::CommStats s = c->stats();
    EXPECT_EQ(s["all_reduce"].calls, 2);
    EXPECT_EQ(s["all_reduce"].bytes, 8000);
    EXPECT_EQ(s["all_gather"].calls, 1);
    EXPECT_EQ(s["all_gather"].bytes, 20);
    EXPECT_EQ(s["reduce_scatter"].bytes, 40);
    EXPECT_EQ(s["broadcast"].bytes, 4000);
    EXPECT_EQ(s["barrier"].calls, 1);
    c->reset_stats();
    EXPECT_TRUE(c->stats().empty());
  });
}

// Each message names the call, the sizes (or peer, or dtype) at fault and the rank.
TEST(Comm, MismatchedSizesAreRejectedBeforeCommunicating) {
  run_ranks(2, [](CommunicatorPtr c) {
    using deepspeed::CommError;
    const std::string rank = " on rank " + std::to_string(c->rank()) + " of 2: ";
    at::Tensor in = at::ones({5}), out = at::empty({9});
    EXPECT_CONTAINS(dstest::message_of<CommError>([&] { c->all_gather(out, in); }),
                    "all_gather" + rank +
                        "the full tensor has 9 elements, expected world_size 2 x 5 = 10");
    EXPECT_CONTAINS(dstest::message_of<CommError>([&] { c->reduce_scatter(in, out); }),
                    "reduce_scatter" + rank +
                        "the full tensor has 9 elements, expected world_size 2 x 5 = 10");
    EXPECT_CONTAINS(dstest::message_of<CommError>([&] { c->broadcast(in, 2); }),
                    "broadcast" + rank + "peer rank 2 is out of range [0, 2)");
    at::Tensor cplx = at::zeros({3}, at::kComplexFloat);
    EXPECT_CONTAINS(dstest::message_of<CommError>([&] { c->broadcast(cplx, 0); }),
                    "broadcast: tensors of dtype complexfloat are not supported");
  });
}

// Runs `op` on rank 0 of a 2-rank group whose rank 1 stays connected but never joins, with a
// 1 s timeout; returns rank 0's CommError message ("" if none).
std::string absent_peer_error(const std::function<void(comm::Communicator&)>& op) {
  std::promise<void> rank0_done;
  std::shared_future<void> done = rank0_done.get_future().share();
  std::string msg;
  run_ranks(
      2,
      [&](CommunicatorPtr c) {
        if (c->rank() == 1) {
          done.wait_for(std::chrono::seconds(60));
          return;
        }
        try {
          op(*c);
        } catch (const deepspeed::CommError& e) {
          msg = e.what();
        } catch (...) {
          rank0_done.set_value();
          throw;
        }
        rank0_done.set_value();
      },
      std::chrono::seconds(1));
  return msg;
}

// A peer that is alive but never joins: only the group's timeout ends the wait, and the error
// must say which collective, its size, the rank and the timeout.
TEST(Comm, AllReduceWithAbsentPeerTimesOut) {
  std::string msg = absent_peer_error([](comm::Communicator& c) {
    at::Tensor t = at::ones({1048576});
    c.all_reduce(t)->wait();
  });
  EXPECT_NE(msg.find("all_reduce of 1048576 elements (float) on rank 0 of 2 failed after"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("(timeout 1 s)"), std::string::npos) << msg;
}

TEST(Comm, RecvWithAbsentPeerTimesOut) {
  std::string msg = absent_peer_error([](comm::Communicator& c) {
    at::Tensor t = at::zeros({7}, at::kBFloat16);
    c.recv(t, 1)->wait();
  });
  EXPECT_NE(msg.find("recv of 7 elements (bfloat16) on rank 0 of 2"), std::string::npos) << msg;
}

TEST(Comm, ReduceScatterWithAbsentPeerTimesOut) {
  std::string msg = absent_peer_error([](comm::Communicator& c) {
    at::Tensor in = at::ones({10}), out = at::empty({5});
    c.reduce_scatter(out, in)->wait();
  });
  EXPECT_NE(msg.find("reduce_scatter of 10 elements (float) on rank 0 of 2"), std::string::npos)
      << msg;
}

TEST(Comm, RunRanksRethrowsTheFailingRanksException) {
  EXPECT_THROW(run_ranks(
                   2,
                   [](CommunicatorPtr c) {
                     if (c->rank() == 1) throw std::logic_error("rank 1 failed on purpose");
                     at::Tensor t = at::ones({4});
                     c->all_reduce(t)->wait();  // fails: the peer is gone
                   },
                   std::chrono::seconds(2)),
               std::logic_error);
}

// A rank that leaves a new group at once (nothing to do on it) does not fail a peer still
// finishing Gloo's connection handshake: setup returns only once every rank is connected. With the
// shared-memory all-reduce off, its own exchange of keys (which hid this) is skipped. The race
// needs a loaded machine, so three threads spin beside the ranks: before the fix this failed
// within a few seconds ("Connection closed by peer" in a peer's setup), and never without load.
TEST(Comm, RankLeavingANewGroupAtOnceDoesNotFailItsPeers) {
  dstest::ScopedEnv off("DS_SHM_ALLREDUCE", "0");
  std::atomic<bool> stop{false};
  std::vector<std::thread> load;
  for (int i = 0; i < 3; ++i) {
    load.emplace_back([&] {
      volatile uint64_t x = 0;
      while (!stop.load(std::memory_order_relaxed)) x = x + 1;
    });
  }
  try {
    for (int round = 0; round < 120; ++round) run_ranks(2 + round % 3, [](CommunicatorPtr) {});
  } catch (...) {
    stop = true;
    for (auto& t : load) t.join();
    throw;
  }
  stop = true;
  for (auto& t : load) t.join();
}

// The std::shared_ptr<c10d::Store> overload (wrapped in a forwarding store) joins like the
// intrusive one.
TEST(Comm, SharedPtrStoreOverload) {
  std::shared_ptr<c10d::Store> store = std::make_shared<c10d::HashStore>();
  store->setTimeout(std::chrono::seconds(20));
  run_threads(2, [&](int rank) {
    CommunicatorPtr c = comm::make_gloo_communicator(store, rank, 2, std::chrono::seconds(20));
    at::Tensor t = at::full({5}, rank + 1.0, at::kDouble);
    c->all_reduce(t, ReduceOp::Avg)->wait();
    EXPECT_TRUE(t.equal(at::full({5}, 1.5, at::kDouble)));
  });
}

TEST(SingleProcess, CollectivesAreLocalAndCounted) {
  CommunicatorPtr c = comm::make_single_process_communicator();
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->world_size(), 1);
  at::Tensor t = pattern(7, 0, at::kBFloat16);
  c->all_reduce(t, ReduceOp::Avg)->wait();
  EXPECT_TRUE(t.equal(pattern(7, 0, at::kBFloat16)));
  at::Tensor out = at::zeros({7}, at::kBFloat16);
  c->all_gather(out, t)->wait();
  EXPECT_TRUE(out.equal(t));
  at::Tensor rs = at::zeros({7}, at::kBFloat16);
  c->reduce_scatter(rs, t)->wait();
  EXPECT_TRUE(rs.equal(t));
  c->broadcast(t, 0)->wait();
  c->barrier();
  EXPECT_THROW(c->send(t, 0), deepspeed::CommError);
  EXPECT_THROW(c->recv(t, 0), deepspeed::CommError);
  EXPECT_THROW(c->broadcast(t, 1), deepspeed::CommError);
  auto s = c->stats();
  EXPECT_EQ(s["all_reduce"].calls, 1);
  EXPECT_EQ(s["all_reduce"].bytes, 14);
  EXPECT_EQ(s["all_gather"].calls, 1);
  EXPECT_EQ(s["reduce_scatter"].calls, 1);
}

// The real rendezvous path: rank 0 hosts a TCPStore on a free port, both ranks join over TCP.
TEST(Init, TcpStoreRendezvousThenAllReduce) {
  const int port = free_tcp_port();
  run_threads(2, [port](int rank) {
    comm::ProcessInfo info;
    info.rank = rank;
    info.world_size = 2;
    info.local_rank = rank;
    info.master_addr = "127.0.0.1";
    info.master_port = port;
    info.source = "env";
    comm::InitOptions opts;
    opts.timeout = std::chrono::seconds(20);
    CommunicatorPtr c = comm::init_from_process_info(info, opts);
    EXPECT_EQ(c->rank(), rank);
    EXPECT_EQ(c->world_size(), 2);
    EXPECT_EQ(c->timeout(), std::chrono::milliseconds(20000));
    at::Tensor t = at::full({1000003}, rank + 1.0, at::kBFloat16);
    c->all_reduce(t)->wait();
    EXPECT_TRUE(t.equal(at::full({1000003}, 3.0, at::kBFloat16)));
    c->barrier();
  });
}

TEST(Init, WorldSizeOneNeedsNoStore) {
  comm::ProcessInfo info;  // world size 1, default port: nothing may be bound
  CommunicatorPtr c = comm::init_from_process_info(info, {});
  EXPECT_EQ(c->world_size(), 1);
}

// A port held by another process: the error names addr:port and says it is in use.
TEST(Init, PortInUseIsReportedClearly) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);

  comm::ProcessInfo info;
  info.world_size = 2;
  info.master_port = port;
  comm::InitOptions opts;
  opts.timeout = std::chrono::seconds(2);
  std::string msg;
  try {
    comm::init_from_process_info(info, opts);
  } catch (const deepspeed::CommError& e) {
    msg = e.what();
  }
  ::close(fd);
  EXPECT_NE(msg.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << msg;
  EXPECT_NE(msg.find("already in use"), std::string::npos) << msg;
}

// A worker whose rank 0 never shows up gives up after the timeout, naming where it looked.
TEST(Init, MissingRankZeroTimesOut) {
  comm::ProcessInfo info;
  info.rank = 1;
  info.world_size = 2;
  info.master_port = free_tcp_port();
  comm::InitOptions opts;
  opts.timeout = std::chrono::seconds(1);
  try {
    comm::init_from_process_info(info, opts);
    FAIL() << "rendezvous without rank 0 succeeded";
  } catch (const deepspeed::CommError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("127.0.0.1:" + std::to_string(info.master_port)), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 1 of 2"), std::string::npos) << msg;
  }
}

// ---- sub-groups (Communicator::split, new_group) ----

namespace {

// Uneven segments, one of them empty, against the locally computed sum.
void check_reduce_scatter_v(comm::Communicator& c, at::ScalarType type) {
  const int w = c.world_size();
  std::vector<int64_t> splits;
  for (int r = 0; r < w; ++r) splits.push_back(r == 1 ? 0 : 3 + 2 * r);
  int64_t total = 0, offset = 0;
  for (int r = 0; r < w; ++r) {
    if (r < c.rank()) offset += splits[r];
    total += splits[r];
  }
  at::Tensor in = pattern(total, c.rank(), type);
  at::Tensor out = at::empty({splits[c.rank()]}, in.options());
  c.reduce_scatter_v(out, in, splits)->wait();
  EXPECT_TRUE(out.equal(expected_reduce(splits[c.rank()], w, type, ReduceOp::Sum, offset)))
      << "reduce_scatter_v " << what(type, total, c.rank());
}

// Every collective the Communicator offers, on a (sub-)communicator, as the world sweep does.
void sweep_group(comm::Communicator& c) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1001}}) {
    for (at::ScalarType type : kTypes) {
      check_all_reduce(c, n, type);
      check_broadcast(c, n, type);
      check_all_gather(c, n, type);
      check_reduce_scatter(c, n, type);
      check_ring(c, n, type);
    }
  }
  for (at::ScalarType type : kTypes) check_reduce_scatter_v(c, type);
  c.barrier();
}

// Sum over the group of each member's world rank: tells which world ranks a group joined.
int64_t sum_of_world_ranks(comm::Communicator& group, int world_rank) {
  at::Tensor t = at::full({1}, world_rank, at::kLong);
  group.all_reduce(t)->wait();
  return t.item<int64_t>();
}

}  // namespace

// 4 ranks as a 2x2 grid: rows {0,1}, {2,3} and columns {0,2}, {1,3}, both alive at once.
TEST(Split, RowsAndColumnsOfFourRanks) {
  run_ranks(4, [](CommunicatorPtr world) {
    const int r = world->rank();
    CommunicatorPtr row = world->split(/*color=*/r / 2, /*key=*/r % 2);
    CommunicatorPtr col = world->split(/*color=*/r % 2, /*key=*/r / 2);
    ASSERT_TRUE(row && col);
    EXPECT_EQ(row->world_size(), 2);
    EXPECT_EQ(col->world_size(), 2);
    EXPECT_EQ(row->rank(), r % 2);
    EXPECT_EQ(col->rank(), r / 2);
    EXPECT_EQ(sum_of_world_ranks(*row, r), r / 2 == 0 ? 0 + 1 : 2 + 3);
    EXPECT_EQ(sum_of_world_ranks(*col, r), r % 2 == 0 ? 0 + 2 : 1 + 3);
    sweep_group(*row);
    sweep_group(*col);
    // The world still works after (and interleaved with) its sub-groups.
    EXPECT_EQ(sum_of_world_ranks(*world, r), 0 + 1 + 2 + 3);
    EXPECT_EQ(sum_of_world_ranks(*row, r) + sum_of_world_ranks(*col, r),
              (r / 2 == 0 ? 1 : 5) + (r % 2 == 0 ? 2 : 4));
  });
}

// Keys order the sub-ranks (ties by parent rank); a negative color joins nothing; a group of
// one is a working single-process communicator; splits nest.
TEST(Split, KeysColorsAndNesting) {
  run_ranks(4, [](CommunicatorPtr world) {
    const int r = world->rank();
    CommunicatorPtr reversed = world->split(0, -r);
    EXPECT_EQ(reversed->rank(), 3 - r);
    EXPECT_EQ(sum_of_world_ranks(*reversed, r), 6);

    CommunicatorPtr odd = world->split(r % 2 == 1 ? 7 : -1, 0);
    EXPECT_EQ(odd == nullptr, r % 2 == 0);
    if (odd) {
      EXPECT_EQ(odd->rank(), r / 2);  // equal keys: parent order
      EXPECT_EQ(sum_of_world_ranks(*odd, r), 1 + 3);
    }

    CommunicatorPtr alone = world->split(r, 0);
    EXPECT_EQ(alone->world_size(), 1);
    EXPECT_EQ(sum_of_world_ranks(*alone, r), r);

    // Nested: the reversed group split in halves by its own ranks.
    CommunicatorPtr half = reversed->split(reversed->rank() / 2, reversed->rank());
    EXPECT_EQ(half->world_size(), 2);
    EXPECT_EQ(sum_of_world_ranks(*half, r), r >= 2 ? 2 + 3 : 0 + 1);
    sweep_group(*half);
  });
}

// As torch.distributed.new_group: members numbered by their rank, not by the list's order.
TEST(Split, NewGroupNumbersRanksInRankOrder) {
  run_ranks(3, [](CommunicatorPtr world) {
    const int r = world->rank();
    CommunicatorPtr g = comm::new_group(*world, {2, 0});
    EXPECT_EQ(g == nullptr, r == 1);
    if (g) {
      EXPECT_EQ(g->rank(), r == 0 ? 0 : 1);
      EXPECT_EQ(sum_of_world_ranks(*g, r), 2);
    }
    EXPECT_CONTAINS(
        dstest::message_of<deepspeed::CommError>([&] { comm::new_group(*world, {0, 0}); }),
        "new_group on rank " + std::to_string(r) +
            " of 3: ranks [0, 0] must be distinct and in [0, 3)");
  });
}

TEST(Split, SingleProcessSplitsIntoItself) {
  CommunicatorPtr c = comm::make_single_process_communicator();
  EXPECT_EQ(c->split(-1, 0), nullptr);
  CommunicatorPtr g = c->split(3, 0);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->world_size(), 1);
}

// ---- all_gather writes into the caller's output only ----

namespace {

// Counts the bytes every CPU tensor allocation asks for while installed.
class CountingAllocator : public deepspeed::compat::HostAllocator {
 public:
  explicit CountingAllocator(at::Allocator* inner) : inner_(inner) {}
  at::DataPtr allocate(size_t n) DS_ALLOCATE_CONST override {
    bytes += static_cast<int64_t>(n);
    return inner_->allocate(n);
  }
  at::DeleterFnPtr raw_deleter() const override { return inner_->raw_deleter(); }
  mutable std::atomic<int64_t> bytes{0};

 private:
  at::Allocator* inner_;
};

// The bytes the CPU allocator handed out on rank 0 while every rank ran `f` (0 on the others),
// between barriers so that no other work of the ranks counts.
int64_t bytes_allocated_on_rank0_during(const CommunicatorPtr& c, const std::function<void()>& f) {
  c->barrier();
  static CountingAllocator* counting = nullptr;  // left to the process: tensors may outlive it
  at::Allocator* previous = c10::GetCPUAllocator();
  if (c->rank() == 0) {
    counting = new CountingAllocator(previous);
    c10::SetCPUAllocator(counting, /*priority=*/100);
  }
  c->barrier();
  f();
  c->barrier();
  int64_t bytes = 0;
  if (c->rank() == 0) {
    bytes = counting->bytes.load();
    c10::SetCPUAllocator(previous, /*priority=*/100);
  }
  c->barrier();
  return bytes;
}

// The three ways a Gloo group on one host gathers host tensors: shared memory (the default),
// Gloo's collectives (DS_SHM_ALLREDUCE=0) and the receive-first messages (gloo_exchange.h; across
// hosts, forced here).
struct GatherPath {
  const char* shm;       // DS_SHM_ALLREDUCE
  const char* exchange;  // DS_GLOO_EXCHANGE
};
const std::vector<GatherPath> kGatherPaths = {{"1", "auto"}, {"0", "auto"}, {"0", "1"}};
std::string describe(const GatherPath& p) {
  return std::string("DS_SHM_ALLREDUCE=") + p.shm + " DS_GLOO_EXCHANGE=" + p.exchange;
}

}  // namespace

// c10d's vector allgather gathers into a flat tensor of its own and copies it out: a second copy
// of every gathered unit. Ours receives straight into the output's slices: while 2 ranks gather
// 4 MB each, the CPU allocator hands out (almost) nothing.
TEST(Comm, AllGatherAllocatesNoSecondCopy) {
  const int64_t n = 512 * 1024;  // per rank, fp32: the output is 4 MiB
  for (const GatherPath& path : kGatherPaths) {
    dstest::ScopedEnv shm("DS_SHM_ALLREDUCE", path.shm);
    dstest::ScopedEnv exchange("DS_GLOO_EXCHANGE", path.exchange);
    run_ranks(2, [&](CommunicatorPtr c) {
      at::Tensor in = pattern(n, c->rank(), at::kFloat);
      at::Tensor out = at::empty({2 * n}, at::kFloat);
      const int64_t bytes =
          bytes_allocated_on_rank0_during(c, [&] { c->all_gather(out, in)->wait(); });
      EXPECT_LT(bytes, 2 * n * 4 / 8) << "all_gather allocated " << bytes << " bytes for a "
                                      << 2 * n * 4 << "-byte output, " << describe(path);
      for (int r = 0; r < 2; ++r)
        EXPECT_TRUE(out.narrow(0, r * n, n).equal(pattern(n, r, at::kFloat)));
    });
  }
}

TEST(Comm, AllGatherIntoNonContiguousOutput) {
  run_ranks(3, [](CommunicatorPtr c) {
    const int64_t n = 10;
    at::Tensor base = at::zeros({n, 3}, at::kBFloat16);
    at::Tensor out = base.t();  // [3, n], strided: staged, then copied back
    ASSERT_FALSE(out.is_contiguous());
    at::Tensor in = pattern(n, c->rank(), at::kBFloat16);
    c->all_gather(out, in)->wait();
    for (int r = 0; r < 3; ++r) EXPECT_TRUE(out[r].equal(pattern(n, r, at::kBFloat16)));
  });
}

// ZeRO's overlapped parameter gather (zero/param_gather.h): chunk [off, off + n) of every rank's
// partition of one flat buffer, the input being this rank's own chunk. Gloo receives each chunk
// in place: no temporary of the gathered size is allocated.
TEST(Comm, AllGatherIntoViewsOfOneBufferAllocatesNoTemporary) {
  const int64_t partition = 3 * 256 * 1024, off = 256 * 1024, n = 256 * 1024;  // bf16
  for (const GatherPath& path : kGatherPaths) {
    dstest::ScopedEnv shm("DS_SHM_ALLREDUCE", path.shm);
    dstest::ScopedEnv exchange("DS_GLOO_EXCHANGE", path.exchange);
    run_ranks(2, [&](CommunicatorPtr c) {
      at::Tensor buffer = at::zeros({2 * partition}, at::kBFloat16);
      std::vector<at::Tensor> views;
      for (int r = 0; r < 2; ++r) views.push_back(buffer.narrow(0, r * partition + off, n));
      views[c->rank()].copy_(pattern(n, c->rank(), at::kBFloat16));
      c->reset_stats();
      const int64_t bytes = bytes_allocated_on_rank0_during(
          c, [&] { c->all_gather_into(views, views[c->rank()])->wait(); });
      EXPECT_LT(bytes, 2 * n * 2 / 8)
          << "all_gather_into allocated " << bytes << " bytes, " << describe(path);
      for (int r = 0; r < 2; ++r) {
        EXPECT_TRUE(buffer.narrow(0, r * partition + off, n).equal(pattern(n, r, at::kBFloat16)));
        EXPECT_EQ(buffer.narrow(0, r * partition, off).count_nonzero().item<int64_t>(), 0)
            << "wrote outside the views";
      }
      EXPECT_EQ(c->stats()["all_gather"].calls, 1);
      EXPECT_EQ(c->stats()["all_gather"].bytes, n * 2);
    });
  }
}

// Three ranks, every dtype it moves, a strided view staged and copied back, and an input that
// is not among the outputs.
TEST(Comm, AllGatherIntoStridedAndSeparateInputs) {
  run_ranks(3, [](CommunicatorPtr c) {
    for (at::ScalarType type : {at::kFloat, at::kBFloat16, at::kHalf, at::kLong}) {
      const int64_t n = 7;
      at::Tensor strided = at::zeros({n, 3}, type);
      std::vector<at::Tensor> outs{at::zeros({n}, type), strided.select(1, 1),
                                   at::zeros({n}, type)};
      ASSERT_FALSE(outs[1].is_contiguous());
      at::Tensor in = pattern(n, c->rank(), type);
      c->all_gather_into(outs, in)->wait();
      for (int r = 0; r < 3; ++r)
        EXPECT_TRUE(outs[r].equal(pattern(n, r, type))) << "rank " << r << " " << type;
      EXPECT_EQ(strided.select(1, 0).count_nonzero().item<int64_t>(), 0);
    }
  });
}

// ---- host tensors as point-to-point messages (gloo_exchange.h) against Gloo's collectives ----

namespace {

// Three ranks: reduce_scatter, reduce_scatter_v (uneven, one empty segment), all_gather,
// all_gather_into and all_to_all, each checked against the reference; three all_gathers in
// flight at once, waited in reverse order (each exchange has its own tag); and a user send/recv
// between ranks 0 and 2 in flight across a collective (the exchange's tags are apart from the
// program's).
void check_collectives_by_message(CommunicatorPtr c) {
  const int r = c->rank(), w = c->world_size();
  for (at::ScalarType type : {at::kFloat, at::kBFloat16}) {
    const int64_t n = 10;
    at::Tensor out = at::zeros({n}, type);
    c->reduce_scatter(out, pattern(n * w, r, type), ReduceOp::Sum)->wait();
    EXPECT_TRUE(out.equal(expected_reduce(n * w, w, type, ReduceOp::Sum).narrow(0, r * n, n)))
        << "reduce_scatter " << type;

    const std::vector<int64_t> splits{4, 0, 9};
    at::Tensor v_out = at::zeros({splits[r]}, type);
    c->reduce_scatter_v(v_out, pattern(13, r, type), splits, ReduceOp::Sum)->wait();
    const int64_t offset = r == 0 ? 0 : 4;
    EXPECT_TRUE(v_out.equal(expected_reduce(13, w, type, ReduceOp::Sum).narrow(0, offset,
                                                                               splits[r])))
        << "reduce_scatter_v " << type;

    at::Tensor gathered = at::zeros({n * w}, type);
    c->all_gather(gathered, pattern(n, r, type))->wait();
    for (int p = 0; p < w; ++p)
      EXPECT_TRUE(gathered.narrow(0, p * n, n).equal(pattern(n, p, type))) << "all_gather";

    at::Tensor buffer = at::zeros({3 * w}, type);
    std::vector<at::Tensor> views;
    for (int p = 0; p < w; ++p) views.push_back(buffer.narrow(0, p * 3 + 1, 2));
    views[r].copy_(pattern(2, r, type));
    c->all_gather_into(views, views[r])->wait();
    for (int p = 0; p < w; ++p) EXPECT_TRUE(views[p].equal(pattern(2, p, type)));
    EXPECT_EQ(buffer.narrow(0, 0, 1).count_nonzero().item<int64_t>(), 0);

    at::Tensor a2a = at::zeros({2 * w}, type);
    c->all_to_all(a2a, pattern(2 * w, r, type))->wait();
    for (int p = 0; p < w; ++p)
      EXPECT_TRUE(a2a.narrow(0, p * 2, 2).equal(pattern(2 * w, p, type).narrow(0, r * 2, 2)))
          << "all_to_all from " << p;
  }
  std::vector<at::Tensor> outs;
  std::vector<deepspeed::comm::WorkPtr> works;
  for (int k = 0; k < 3; ++k) {
    outs.push_back(at::zeros({5 * w}));
    works.push_back(c->all_gather(outs.back(), pattern(5, r, at::kFloat, k)));
  }
  for (int k = 2; k >= 0; --k) {
    works[k]->wait();
    for (int p = 0; p < w; ++p)
      EXPECT_TRUE(outs[k].narrow(0, p * 5, 5).equal(pattern(5, p, at::kFloat, k))) << k;
  }
  at::Tensor msg = r == 0 ? pattern(6, 0, at::kFloat, 9) : at::zeros({6});
  deepspeed::comm::WorkPtr p2p;
  if (r == 0) p2p = c->send(msg, 2, 0);
  if (r == 2) p2p = c->recv(msg, 0, 0);
  at::Tensor gathered = at::zeros({4 * w});
  c->all_gather(gathered, pattern(4, r, at::kFloat))->wait();
  if (p2p) p2p->wait();
  EXPECT_TRUE(gathered.narrow(0, w * 4 - 4, 4).equal(pattern(4, w - 1, at::kFloat)));
  if (r == 2) EXPECT_TRUE(msg.equal(pattern(6, 0, at::kFloat, 9)));
}

}  // namespace

// DS_SHM_ALLREDUCE=0 keeps reduce_scatter_v off shared memory: on Gloo either way. The ranks
// here share one host, where the default (auto) keeps Gloo's collectives: "1" forces messages.
TEST(Comm, HostCollectivesAsMessagesWithReceivesFirst) {
  dstest::ScopedEnv shm("DS_SHM_ALLREDUCE", "0"), exchange("DS_GLOO_EXCHANGE", "1");
  run_ranks(3, [](CommunicatorPtr c) {
    ASSERT_TRUE(deepspeed::comm::gloo_exchanges_host_tensors(*c));
    check_collectives_by_message(c);
  });
}

// A peer that arrives late (longer than the failure board's polling slice): the messages are
// waited on whole (a timed-out wait on a Gloo send/recv work closes its pairs for good).
TEST(Comm, HostCollectiveAsMessagesWaitsForALatePeer) {
  dstest::ScopedEnv shm("DS_SHM_ALLREDUCE", "0"), exchange("DS_GLOO_EXCHANGE", "1");
  run_ranks(2, [](CommunicatorPtr c) {
    ASSERT_TRUE(deepspeed::comm::gloo_exchanges_host_tensors(*c));
    if (c->rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    at::Tensor out = at::zeros({8});
    c->all_gather(out, pattern(4, c->rank(), at::kFloat))->wait();
    EXPECT_TRUE(out.narrow(0, 4, 4).equal(pattern(4, 1, at::kFloat)));
    at::Tensor part = at::zeros({4});
    if (c->rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    c->reduce_scatter(part, pattern(8, c->rank(), at::kFloat), ReduceOp::Sum)->wait();
    EXPECT_TRUE(part.equal(expected_reduce(8, 2, at::kFloat, ReduceOp::Sum)
                               .narrow(0, 4 * c->rank(), 4)));
  });
}

TEST(Comm, HostCollectivesThroughGlooOnOneHostOrWithTheExchangeOff) {
  dstest::ScopedEnv shm("DS_SHM_ALLREDUCE", "0");
  for (const char* mode : {"0", "auto"}) {
    dstest::ScopedEnv exchange("DS_GLOO_EXCHANGE", mode);
    run_ranks(3, [](CommunicatorPtr c) {
      ASSERT_FALSE(deepspeed::comm::gloo_exchanges_host_tensors(*c));
      check_collectives_by_message(c);
    });
  }
}

TEST(Comm, GlooExchangeSettingOtherThanOnOrOffNamesTheVariable) {
  dstest::ScopedEnv exchange("DS_GLOO_EXCHANGE", "yes");
  EXPECT_CONTAINS(
      dstest::message_of<std::exception>([] { run_ranks(2, [](CommunicatorPtr) {}); }),
      "environment variable DS_GLOO_EXCHANGE='yes' must be auto");
}

// ---- strided outputs and the group of one ----

namespace {

// Chunk `rank` of every rank's pattern(n) (n = 2 * chunk), in rank order: what all_to_all of
// pattern(n) hands rank `rank` of 2.
at::Tensor expected_all_to_all(int64_t chunk, int rank) {
  return at::cat({pattern(2 * chunk, 0, at::kFloat).narrow(0, rank * chunk, chunk),
                  pattern(2 * chunk, 1, at::kFloat).narrow(0, rank * chunk, chunk)});
}

// A strided (non-contiguous) view of n fresh zeros: every other element of a [n, 2] tensor.
at::Tensor strided_zeros(int64_t n) { return at::zeros({n, 2}).select(1, 0); }

}  // namespace

// A strided output (a transposed or sliced view) is written through the view, as all_reduce and
// all_gather write theirs: by Gloo's all_to_all and reduce_scatter_v (its shared-memory path for
// small inputs, its all-to-all above the shared-memory limit) and by the interface's default
// implementations (called past the override).
TEST(Comm, AllToAllAndReduceScatterVIntoNonContiguousOutput) {
  run_ranks(2, [](CommunicatorPtr c) {
    const int r = c->rank();
    const int64_t chunk = 6;
    at::Tensor in = pattern(2 * chunk, r, at::kFloat);
    at::Tensor own = at::zeros({3, 4}).t(), dflt = at::zeros({3, 4}).t();  // [4, 3], strided
    ASSERT_FALSE(own.is_contiguous());
    c->all_to_all(own, in)->wait();
    c->comm::Communicator::all_to_all(dflt, in)->wait();
    EXPECT_TRUE(own.equal(expected_all_to_all(chunk, r).view({4, 3}))) << own;
    EXPECT_TRUE(dflt.equal(expected_all_to_all(chunk, r).view({4, 3}))) << dflt;

    for (int64_t n : {int64_t{12}, int64_t{300001}}) {  // 1.2 MB: above the shared-memory limit
      const std::vector<int64_t> splits = {n / 3, n - n / 3};
      const int64_t offset = r == 0 ? 0 : splits[0];
      at::Tensor grads = pattern(n, r, at::kFloat);
      at::Tensor out = strided_zeros(splits[r]), out_dflt = strided_zeros(splits[r]);
      c->reduce_scatter_v(out, grads, splits)->wait();
      c->comm::Communicator::reduce_scatter_v(out_dflt, grads, splits)->wait();
      const at::Tensor want = expected_reduce(splits[r], 2, at::kFloat, ReduceOp::Sum, offset);
      EXPECT_TRUE(out.equal(want)) << "n=" << n;
      EXPECT_TRUE(out_dflt.equal(want)) << "n=" << n;
    }
  });
}

// A group of one times its collectives, as DeepSpeed's comms logger times them on a group of one
// (so a one-rank job's comms table is not empty), each under its own name: reduce_scatter_v and
// all_to_all are not the defaults' all_reduce of a copy and all_gather of world x the input.
TEST(SingleProcess, CollectivesAreTimedUnderTheirOwnNames) {
  CommunicatorPtr c = comm::make_single_process_communicator();
  c->keep_latencies();
  at::Tensor t = pattern(12, 0, at::kFloat);
  c->all_reduce(t)->wait();
  c->broadcast(t, 0)->wait();
  at::Tensor out = at::zeros({12});
  c->all_gather(out, t)->wait();
  c->reduce_scatter(out, t)->wait();
  at::Tensor v = strided_zeros(12), a = at::zeros({3, 4}).t();
  c->reduce_scatter_v(v, t, {12})->wait();
  c->all_to_all(a, t)->wait();
  EXPECT_TRUE(v.equal(t));
  EXPECT_TRUE(a.equal(t.view({4, 3})));
  at::Tensor none = at::zeros({0});
  c->all_reduce(none)->wait();  // counted, not timed: as Gloo skips an empty collective
  const comm::CommStats s = c->stats();
  EXPECT_EQ(s.size(), 6u);
  for (const char* op :
       {"all_reduce", "broadcast", "all_gather", "reduce_scatter", "reduce_scatter_v", "all_to_all"}) {
    ASSERT_TRUE(s.count(op)) << op;
    const comm::OpStats& o = s.at(op);
    EXPECT_EQ(o.calls, op == std::string("all_reduce") ? 2 : 1) << op;
    ASSERT_EQ(o.by_size.size(), 1u) << op;
    EXPECT_EQ(o.by_size.begin()->first, 48) << op;
    EXPECT_EQ(o.by_size.begin()->second.calls, 1) << op;
    EXPECT_EQ(o.by_size.begin()->second.latencies_ms.size(), 1u) << op;
  }
}

}  // namespace comm_test
