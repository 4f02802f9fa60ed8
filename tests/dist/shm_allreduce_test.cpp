// The shared-memory all-reduce (src/comm/shm_allreduce.h) that Gloo communicators use when every
// rank is on this host: its results against the Gloo path's (the same ranks with
// DS_SHM_ALLREDUCE=0) over sizes 0, 1, odd, at and above the size limit, every dtype and op;
// sub-groups and concurrent groups; handles waited late and out of order; the statistics; and a
// peer that leaves or stalls. Tensors of many pieces (small slots, so that tests stay fast):
// every dtype and op against Gloo, issued all before any wait, the share method against the
// all-rows method bit for bit. (A peer killed with SIGKILL: tests/launcher/shm_rank_killed.sh.)
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/gloo_communicator.h"
#include "comm/shm_segment.h"
#include "support/ranks.h"
#include "support/scoped_env.h"
#include "support/shm_stats.h"

namespace shm_allreduce_test {

namespace comm = deepspeed::comm;
using comm::CommunicatorPtr;
using comm::ReduceOp;

namespace {

// Sets an environment variable for the scope of a test (between run_ranks calls: no thread
// reads the environment meanwhile).
using dstest::ScopedEnv;

struct Case {
  int64_t numel;
  at::ScalarType type;
  ReduceOp op;
};

// Rank r's input for case i: random values (normal floats, integers in [-1000, 1000]) that
// differ between ranks and cases, the same in every run.
at::Tensor input(const Case& c, int rank, int i) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 * rank + i);
  if (at::isFloatingType(c.type)) return at::randn({c.numel}, gen, at::kDouble).to(c.type);
  return at::randint(-1000, 1001, {c.numel}, gen, at::kLong).to(c.type);
}

std::vector<Case> sweep_cases(size_t limit) {
  const std::vector<at::ScalarType> types = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16,
                                             at::kInt,   at::kLong,   at::kShort};
  std::vector<Case> cases;
  for (at::ScalarType t : types)
    for (int64_t n : {0, 1, 7, 769})
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min})
        cases.push_back({n, t, op});
  // At the size limit (shared memory) and one element above it (Gloo), fp32 and bf16.
  for (at::ScalarType t : {at::kFloat, at::kBFloat16}) {
    const int64_t at_limit = static_cast<int64_t>(limit) / c10::elementSize(t);
    for (int64_t n : {at_limit, at_limit + 1}) cases.push_back({n, t, ReduceOp::Sum});
  }
  return cases;
}

// results[rank][case] of all_reduce over `world` ranks; `shm_limit[rank]` what the communicator
// reports.
struct Results {
  std::vector<std::vector<at::Tensor>> out;
  std::vector<size_t> shm_limit;
};

// `outstanding`: every case is issued before any is waited on (as ZeRO issues its buckets), and
// the handles are waited on in reverse order.
Results run_cases(int world, const std::vector<Case>& cases, bool outstanding = false) {
  Results r;
  r.out.assign(world, {});
  r.shm_limit.assign(world, 0);
  run_ranks(world, [&](CommunicatorPtr c) {
    r.shm_limit[c->rank()] = comm::shm_allreduce_limit(*c);
    std::vector<at::Tensor> mine;
    std::vector<comm::WorkPtr> works;
    for (size_t i = 0; i < cases.size(); ++i) {
      at::Tensor t = input(cases[i], c->rank(), static_cast<int>(i));
      works.push_back(c->all_reduce(t, cases[i].op));
      if (!outstanding) works.back()->wait();
      mine.push_back(t);
    }
    for (auto w = works.rbegin(); w != works.rend(); ++w) (*w)->wait();
    r.out[c->rank()] = std::move(mine);
  });
  return r;
}

std::string describe(const Case& c) {
  static const char* ops[] = {"sum", "max", "min", "avg"};
  return std::string(c10::toString(c.type)) + " n=" + std::to_string(c.numel) + " " +
         ops[static_cast<int>(c.op)];
}

void expect_same_on_every_rank(const Results& r, const std::vector<Case>& cases) {
  for (size_t i = 0; i < cases.size(); ++i)
    for (size_t rank = 1; rank < r.out.size(); ++rank)
      EXPECT_TRUE(r.out[rank][i].equal(r.out[0][i])) << describe(cases[i]) << " rank " << rank;
}

// Shared-memory results vs Gloo's. `bitwise`: equal bits. Otherwise (more than two ranks, where
// Gloo's ring adds in another order than ours, rank 0 first): integers, max and min equal; float
// sums within the reordering bound n_ranks * eps(dtype) * sum_r |x_r| (fp16 a little more: Gloo
// rounds to fp16 after every add, we once).
void expect_matches(const Results& shm, const Results& gloo, const std::vector<Case>& cases,
                    bool bitwise) {
  const int world = static_cast<int>(shm.out.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const at::Tensor& a = shm.out[0][i];
    const at::Tensor& b = gloo.out[0][i];
    ASSERT_EQ(a.scalar_type(), c.type) << describe(c);
    const bool exact = bitwise || !at::isFloatingType(c.type) || c.op == ReduceOp::Max ||
                       c.op == ReduceOp::Min;
    if (exact) {
      EXPECT_TRUE(a.equal(b)) << describe(c) << ": shared memory and Gloo differ";
      continue;
    }
    at::Tensor abs_sum = at::zeros({c.numel}, at::kDouble);
    for (int r = 0; r < world; ++r) abs_sum += input(c, r, static_cast<int>(i)).to(at::kDouble).abs();
    double eps = c.type == at::kHalf ? 2 * 9.77e-4 : c.type == at::kBFloat16 ? 7.82e-3
               : c.type == at::kFloat ? 1.2e-7 : 2.3e-16;
    at::Tensor bound = abs_sum * (world * eps);
    if (c.op == ReduceOp::Avg) bound /= world;
    at::Tensor diff = (a.to(at::kDouble) - b.to(at::kDouble)).abs();
    EXPECT_TRUE(diff.le(bound + 1e-30).all().item<bool>())
        << describe(c) << ": max difference " << diff.max().item<double>();
  }
}

// A crashed job's segment left in /dev/shm under the name this process would use (containers
// sharing /dev/shm reuse low pids: "ds_shm_<pid>_<n>", n counting the segments this process
// made) does not switch the group to Gloo: the name carries a random part too. First in the
// file, so that this process has made few segments yet: the leftovers cover n < 256.
TEST(ShmAllReduce, LeftoverSegmentOfTheSamePidDoesNotTurnItOff) {
  std::vector<std::string> made;
  for (int n = 0; n < 256; ++n) {
    const std::string name = "/ds_shm_" + std::to_string(::getpid()) + "_" + std::to_string(n);
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) continue;
    ::close(fd);
    made.push_back(name);
  }
  ASSERT_FALSE(made.empty()) << "no /dev/shm to test with";
  std::vector<size_t> limit(2);
  try {
    run_ranks(2, [&](CommunicatorPtr c) { limit[c->rank()] = comm::shm_allreduce_limit(*c); });
  } catch (...) {
    for (const auto& name : made) ::shm_unlink(name.c_str());
    throw;
  }
  for (const auto& name : made) ::shm_unlink(name.c_str());
  EXPECT_GT(limit[0], 0u);
  EXPECT_GT(limit[1], 0u);
}

// The retry behind the test above, with the names drawn here: a name that exists is left as it
// is and the next token is tried; when every try meets an existing name the group keeps to Gloo,
// saying how many names were tried.
TEST(ShmAllReduce, ExistingNamesAreSkippedNotReused) {
  const std::string stem = "/ds_shm_test_" + std::to_string(::getpid());
  std::vector<std::string> tokens;
  for (char c = 'a'; c <= 'i'; ++c) tokens.emplace_back(1, c);
  std::vector<std::string> leftovers;  // a crashed job's, holding one byte we check survives
  struct Unlink {  // every name the test may make, however it ends
    std::string stem;
    std::vector<std::string> tokens;
    void operator()() const {
      for (const auto& t : tokens) ::shm_unlink((stem + "_" + t).c_str());
    }
    ~Unlink() { (*this)(); }
  } cleanup{stem, tokens};
  // false (and a test failure) when /dev/shm cannot hold it
  auto leave = [&](const std::string& token) {
    const std::string name = stem + "_" + token;
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      ADD_FAILURE() << "cannot create " << name << " to test with";
      return false;
    }
    const bool wrote = ::write(fd, "L", 1) == 1;
    ::close(fd);
    leftovers.push_back(name);
    EXPECT_TRUE(wrote) << name;
    return wrote;
  };
  cleanup();
  ASSERT_TRUE(leave("a") && leave("b"));
  size_t drawn = 0;
  auto next = [&] { return tokens.at(drawn++); };
  std::string name;
  const int fd = comm::create_exclusive_segment(stem, 2, name, next);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(name, stem + "_c");
  EXPECT_EQ(drawn, 3u);
  if (fd >= 0) ::close(fd);
  for (const auto& left : leftovers) {  // untouched: not truncated, not reopened
    struct stat st {};
    const int lfd = ::shm_open(left.c_str(), O_RDONLY, 0);
    ASSERT_GE(lfd, 0) << left;
    EXPECT_EQ(::fstat(lfd, &st), 0);
    EXPECT_EQ(st.st_size, 1) << left;
    ::close(lfd);
  }
  // Every one of the 8 tries (a..h; "c" is the segment just made) meets an existing name: -1,
  // said on stderr naming the last; "i" is never drawn.
  for (const char* t : {"d", "e", "f", "g", "h"}) ASSERT_TRUE(leave(t));
  drawn = 0;
  testing::internal::CaptureStderr();
  const int none = comm::create_exclusive_segment(stem, 2, name, next);
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_EQ(none, -1);
  EXPECT_EQ(drawn, 8u);
  EXPECT_NE(said.find("8 names tried"), std::string::npos) << said;
  EXPECT_NE(said.find(stem + "_h"), std::string::npos) << said;
  EXPECT_NE(said.find("through Gloo"), std::string::npos) << said;
}

TEST(ShmAllReduce, OnForLocalGroupsOffWithTheSwitch) {
  run_ranks(2, [](CommunicatorPtr c) {
    EXPECT_GT(comm::shm_allreduce_limit(*c), 0u) << "ranks as threads share this host";
  });
  ScopedEnv off("DS_SHM_ALLREDUCE", "0");
  run_ranks(2, [](CommunicatorPtr c) { EXPECT_EQ(comm::shm_allreduce_limit(*c), 0u); });
}

TEST(ShmAllReduce, BadSwitchValueIsNamed) {
  ScopedEnv bad("DS_SHM_ALLREDUCE", "maybe");
  try {
    run_ranks(2, [](CommunicatorPtr) {}, std::chrono::seconds(5));
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("DS_SHM_ALLREDUCE='maybe'"), std::string::npos)
        << e.what();
  }
}

// The sweeps' last cases are at a size limit and one element above it (Gloo): 1 MiB here (the
// default is any size).
constexpr char kSweepLimit[] = "1048576";

TEST(ShmAllReduce, EqualsGlooBitwiseOnTwoRanks) {
  ScopedEnv limit("DS_SHM_ALLREDUCE_MAX_BYTES", kSweepLimit);
  Results gloo;
  {
    ScopedEnv off("DS_SHM_ALLREDUCE", "0");
    gloo = run_cases(2, sweep_cases(comm::shm_allreduce_max_bytes_from_env()));
  }
  const auto cases = sweep_cases(comm::shm_allreduce_max_bytes_from_env());
  Results shm = run_cases(2, cases);
  ASSERT_EQ(gloo.shm_limit[0], 0u);
  ASSERT_GT(shm.shm_limit[0], 0u);
  expect_same_on_every_rank(shm, cases);
  expect_matches(shm, gloo, cases, /*bitwise=*/true);
}

TEST(ShmAllReduce, MatchesGlooOnThreeAndFourRanks) {
  ScopedEnv limit("DS_SHM_ALLREDUCE_MAX_BYTES", kSweepLimit);
  for (int world : {3, 4}) {
    const auto cases = sweep_cases(comm::shm_allreduce_max_bytes_from_env());
    Results gloo;
    {
      ScopedEnv off("DS_SHM_ALLREDUCE", "0");
      gloo = run_cases(world, cases);
    }
    Results shm = run_cases(world, cases);
    ASSERT_EQ(gloo.shm_limit[0], 0u);
    ASSERT_GT(shm.shm_limit[0], 0u);
    expect_same_on_every_rank(shm, cases);
    expect_matches(shm, gloo, cases, /*bitwise=*/false);
  }
}

// Tensor-parallel groups of two inside a world of four, each all-reducing on its own thread
// while a second thread of every rank all-reduces over the world: the three segments never mix.
TEST(ShmAllReduce, SubGroupsAndConcurrentGroups) {
  run_ranks(4, [](CommunicatorPtr world) {
    const int rank = world->rank();
    CommunicatorPtr tp = world->split(rank / 2, rank);
    ASSERT_EQ(tp->world_size(), 2);
    EXPECT_GT(comm::shm_allreduce_limit(*tp), 0u);
    std::thread tp_thread([&] {
      for (int step = 0; step < 200; ++step) {
        at::Tensor row = at::full({1, 768}, rank + step, at::kFloat);
        tp->all_reduce(row)->wait();
        // Ranks 2g and 2g+1: (2g + step) + (2g + 1 + step).
        const double want = 2 * (rank / 2 * 2 + step) + 1;
        ASSERT_TRUE(row.eq(want).all().item<bool>()) << "tp step " << step << " rank " << rank;
      }
    });
    for (int step = 0; step < 200; ++step) {
      at::Tensor v = at::full({33}, rank * 10 + step, at::kLong);
      world->all_reduce(v)->wait();
      ASSERT_TRUE(v.eq(60 + 4 * step).all().item<bool>()) << "world step " << step;
    }
    tp_thread.join();
  });
}

// More handles outstanding than the segment has slots (ZeRO issues every bucket before waiting),
// waited in reverse order; non-contiguous tensors are staged and copied back.
TEST(ShmAllReduce, HandlesWaitedLateAndOutOfOrder) {
  run_ranks(2, [](CommunicatorPtr c) {
    std::vector<at::Tensor> ts;
    std::vector<comm::WorkPtr> works;
    for (int i = 0; i < 11; ++i) {
      ts.push_back(at::full({5 + i}, c->rank() + i, at::kFloat));
      works.push_back(c->all_reduce(ts.back()));
    }
    for (int i = 10; i >= 0; --i) {
      works[i]->wait();
      EXPECT_TRUE(ts[i].eq(1 + 2 * i).all().item<bool>()) << "op " << i;
    }
    at::Tensor grid = at::arange(12, at::kFloat).view({3, 4}).add(c->rank());
    at::Tensor column = grid.select(1, 2);  // stride 4
    c->all_reduce(column, ReduceOp::Max)->wait();
    EXPECT_TRUE(column.equal(at::tensor({3.f, 7.f, 11.f}))) << column;
    EXPECT_EQ(grid[0][0].item<float>(), c->rank());  // the rest untouched
  });
}

// Pieces of 4 KiB (1024 fp32): counts below, at and above one piece, odd counts that leave a
// partial last piece, and more pieces than the segment has slots; every dtype and op.
constexpr char kSmallSlot[] = "4096";

std::vector<Case> piece_cases() {
  std::vector<Case> cases;
  for (at::ScalarType t : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kInt, at::kLong}) {
    const int64_t per_piece = 4096 / static_cast<int64_t>(c10::elementSize(t));
    for (int64_t n : {per_piece - 1, per_piece, per_piece + 1, 3 * per_piece + 7,
                      9 * per_piece + 13})
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min})
        cases.push_back({n, t, op});
  }
  return cases;
}

TEST(ShmAllReduce, ManyPiecesEqualGlooBitwiseOnTwoRanks) {
  ScopedEnv slot("DS_SHM_ALLREDUCE_SLOT_BYTES", kSmallSlot);
  ScopedEnv max("DS_SHM_ALLREDUCE_MAX_BYTES", "1073741824");
  const auto cases = piece_cases();
  Results gloo;
  {
    ScopedEnv off("DS_SHM_ALLREDUCE", "0");
    gloo = run_cases(2, cases);
  }
  for (bool outstanding : {false, true}) {
    Results shm = run_cases(2, cases, outstanding);
    ASSERT_EQ(shm.shm_limit[0], 1073741824u);
    expect_same_on_every_rank(shm, cases);
    expect_matches(shm, gloo, cases, /*bitwise=*/true);
  }
}

// With more than two ranks, pieces of at least DS_SHM_ALLREDUCE_SHARE_BYTES are reduced in
// shares: the same bits as reducing all rows (each element in rank order either way), and
// Gloo's result within the reordering bound.
TEST(ShmAllReduce, ManyPiecesInSharesMatchOnThreeAndFourRanks) {
  ScopedEnv slot("DS_SHM_ALLREDUCE_SLOT_BYTES", kSmallSlot);
  ScopedEnv max("DS_SHM_ALLREDUCE_MAX_BYTES", "1073741824");
  const auto cases = piece_cases();
  for (int world : {3, 4}) {
    Results gloo, all_rows;
    {
      ScopedEnv off("DS_SHM_ALLREDUCE", "0");
      gloo = run_cases(world, cases);
    }
    {
      ScopedEnv never("DS_SHM_ALLREDUCE_SHARE_BYTES", "1073741824");
      all_rows = run_cases(world, cases);
    }
    ScopedEnv always("DS_SHM_ALLREDUCE_SHARE_BYTES", "1");
    Results shares = run_cases(world, cases, /*outstanding=*/true);
    ASSERT_GT(shares.shm_limit[0], 0u);
    expect_same_on_every_rank(shares, cases);
    expect_matches(shares, all_rows, cases, /*bitwise=*/true);
    expect_matches(shares, gloo, cases, /*bitwise=*/false);
  }
}

// Multi-piece operations of different sizes, all outstanding (more pieces than slots in each),
// waited on in an arbitrary order from two threads, plus a non-contiguous one: exact sums.
// Whole pieces are reduced in shares, partial last pieces of less than 2 KiB from all rows.
TEST(ShmAllReduce, OutstandingMultiPieceOperations) {
  ScopedEnv slot("DS_SHM_ALLREDUCE_SLOT_BYTES", kSmallSlot);
  ScopedEnv max("DS_SHM_ALLREDUCE_MAX_BYTES", "1073741824");
  ScopedEnv share("DS_SHM_ALLREDUCE_SHARE_BYTES", "2048");
  run_ranks(3, [](CommunicatorPtr c) {
    const int rank = c->rank();
    std::vector<at::Tensor> ts;
    std::vector<comm::WorkPtr> works;
    for (int i = 0; i < 7; ++i) {  // 1024 floats a piece: 1 to ~13 pieces each
      ts.push_back(at::arange(1000 + 2011 * i, at::kFloat).add(rank * 1000 + i));
      works.push_back(c->all_reduce(ts.back()));
    }
    at::Tensor grid = at::arange(3 * 5000, at::kLong).view({5000, 3}).add(rank);
    at::Tensor column = grid.select(1, 1);  // stride 3, 5000 int64: 5 pieces
    works.push_back(c->all_reduce(column, ReduceOp::Max));
    std::thread other([&] {
      for (int i : {5, 1, 3}) works[i]->wait();
    });
    for (int i : {6, 0, 7, 2, 4}) works[i]->wait();
    other.join();
    for (int i = 0; i < 7; ++i) {
      // sum over r of (k + 1000 r + i) = 3k + 3000 + 3i: exact in fp32 below 2^24.
      at::Tensor want = at::arange(1000 + 2011 * i, at::kFloat).mul(3).add(3000 + 3 * i);
      EXPECT_TRUE(ts[i].equal(want)) << "operation " << i << " rank " << rank;
    }
    EXPECT_TRUE(column.equal(at::arange(5000, at::kLong).mul(3).add(1 + 2))) << "rank " << rank;
    EXPECT_EQ(grid[0][0].item<int64_t>(), rank);  // the rest untouched
  });
}

// reduce_scatter_v (ZeRO-2's gradient buckets) through shared memory: segments that cross piece
// boundaries, empty ones, every dtype and op, all issued before any wait; against the Gloo path
// (all-to-all plus a local reduction), bit for bit at 2 ranks.
struct ScatterCase {
  at::ScalarType type;
  ReduceOp op;
  std::vector<int64_t> splits;
};

std::vector<ScatterCase> scatter_cases(int world) {
  std::vector<ScatterCase> cases;
  for (at::ScalarType t : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kInt, at::kLong}) {
    const int64_t p = 4096 / static_cast<int64_t>(c10::elementSize(t));  // elements a piece
    const std::vector<std::vector<int64_t>> patterns = {{2 * p + 3, 0, p + 1, 3 * p - 7},
                                                        {1, 3 * p + 5, 7, 2 * p}};
    for (const auto& pattern : patterns)
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min})
        cases.push_back({t, op, std::vector<int64_t>(pattern.begin(), pattern.begin() + world)});
  }
  return cases;
}

// out[rank][case].
std::vector<std::vector<at::Tensor>> run_scatter(int world, const std::vector<ScatterCase>& cases) {
  std::vector<std::vector<at::Tensor>> out(world);
  run_ranks(world, [&](CommunicatorPtr c) {
    std::vector<at::Tensor> mine;
    std::vector<comm::WorkPtr> works;
    for (size_t i = 0; i < cases.size(); ++i) {
      const ScatterCase& sc = cases[i];
      int64_t total = 0;
      for (int64_t n : sc.splits) total += n;
      at::Tensor in = input({total, sc.type, sc.op}, c->rank(), static_cast<int>(i));
      mine.push_back(at::full({sc.splits[c->rank()]}, -7, sc.type));
      works.push_back(c->reduce_scatter_v(mine.back(), in, sc.splits, sc.op));
    }
    for (auto w = works.rbegin(); w != works.rend(); ++w) (*w)->wait();
    out[c->rank()] = std::move(mine);
  });
  return out;
}

TEST(ShmAllReduce, ReduceScatterVMatchesGloo) {
  ScopedEnv slot("DS_SHM_ALLREDUCE_SLOT_BYTES", kSmallSlot);
  ScopedEnv max("DS_SHM_ALLREDUCE_MAX_BYTES", "1073741824");
  for (int world : {2, 3}) {
    const auto cases = scatter_cases(world);
    std::vector<std::vector<at::Tensor>> gloo;
    {
      ScopedEnv off("DS_SHM_ALLREDUCE", "0");
      gloo = run_scatter(world, cases);
    }
    const auto shm = run_scatter(world, cases);
    for (int r = 0; r < world; ++r)
      for (size_t i = 0; i < cases.size(); ++i) {
        const ScatterCase& c = cases[i];
        const std::string what = std::string(c10::toString(c.type)) + " op " +
                                 std::to_string(static_cast<int>(c.op)) + " case " +
                                 std::to_string(i) + " rank " + std::to_string(r) + " world " +
                                 std::to_string(world);
        ASSERT_EQ(shm[r][i].numel(), c.splits[r]) << what;
        if (world == 2 || !at::isFloatingType(c.type) || c.op == ReduceOp::Max ||
            c.op == ReduceOp::Min) {
          EXPECT_TRUE(shm[r][i].equal(gloo[r][i])) << what;
        } else {  // three ranks: sums may be reordered; inputs are normal, sums below ~10
          const double tol = c.type == at::kHalf ? 1e-2 : c.type == at::kBFloat16 ? 6e-2 : 1e-5;
          EXPECT_TRUE(at::allclose(shm[r][i].to(at::kDouble), gloo[r][i].to(at::kDouble), 0, tol))
              << what;
        }
      }
  }
}

TEST(ShmAllReduce, StatsCountTheSameAsGloo) {
  const auto stats = dstest::stats_without_and_with_shm([](CommunicatorPtr c) {
    for (int64_t n : {0, 1, 768, 1000}) {
      at::Tensor t = at::ones({n}, at::kFloat);
      c->all_reduce(t)->wait();
    }
    at::Tensor b = at::ones({3}, at::kBFloat16);
    c->all_reduce(b, ReduceOp::Avg)->wait();
  });
  dstest::expect_counted_alike(stats, "all_reduce", 5);
}

// Nothing is left in /dev/shm: names are unlinked once every rank has attached.
TEST(ShmAllReduce, NoSegmentOutlivesSetup) {
  auto ours = [] {
    const std::string prefix = "ds_shm_" + std::to_string(::getpid()) + "_";
    int n = 0;
    if (DIR* d = ::opendir("/dev/shm")) {
      while (dirent* e = ::readdir(d)) n += std::string(e->d_name).rfind(prefix, 0) == 0;
      ::closedir(d);
    }
    return n;
  };
  run_ranks(4, [&](CommunicatorPtr world) {
    CommunicatorPtr tp = world->split(world->rank() / 2, 0);
    at::Tensor t = at::ones({4});
    tp->all_reduce(t)->wait();
    world->barrier();
    EXPECT_EQ(ours(), 0);
  });
  EXPECT_EQ(ours(), 0);
}

// A peer whose communicator goes away (its thread ended) while the other waits for it: the
// survivor fails at once, naming the operation and the peer, not after the timeout.
TEST(ShmAllReduce, PeerThatLeavesFailsTheWaitingRank) {
  std::string message;
  run_ranks(
      2,
      [&](CommunicatorPtr c) {
        if (c->rank() == 1) return;  // leaves without its all_reduce
        at::Tensor t = at::ones({1024});
        try {
          c->all_reduce(t)->wait();
        } catch (const deepspeed::CommError& e) {
          message = e.what();
        }
        // The group stays broken: the next call fails at once with the same message.
        try {
          c->all_reduce(t)->wait();
          ADD_FAILURE() << "second all_reduce succeeded";
        } catch (const deepspeed::CommError& e) {
          EXPECT_EQ(message, e.what());
        }
      },
      std::chrono::seconds(60));
  EXPECT_NE(message.find("all_reduce of 1024 elements (float) on rank 0 of 2 failed after"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("rank 1 (pid"), std::string::npos) << message;
  EXPECT_NE(message.find("left the group"), std::string::npos) << message;
}

// The same for an operation of many pieces: the message names the operation and its piece.
TEST(ShmAllReduce, PeerThatLeavesFailsAMultiPieceOperation) {
  ScopedEnv slot("DS_SHM_ALLREDUCE_SLOT_BYTES", kSmallSlot);
  ScopedEnv max("DS_SHM_ALLREDUCE_MAX_BYTES", "1073741824");
  std::string message;
  run_ranks(
      2,
      [&](CommunicatorPtr c) {
        if (c->rank() == 1) return;
        at::Tensor t = at::ones({10 * 1024});  // 10 pieces
        try {
          c->all_reduce(t)->wait();
        } catch (const deepspeed::CommError& e) {
          message = e.what();
        }
      },
      std::chrono::seconds(60));
  EXPECT_NE(message.find("all_reduce of 10240 elements (float) on rank 0 of 2 failed after"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("(piece 1 of 10)"), std::string::npos) << message;
  EXPECT_NE(message.find("left the group"), std::string::npos) << message;
}

// A peer that stalls past the timeout: the waiting rank's all_reduce fails after the timeout,
// naming the operation, the timeout and the late rank. The late rank joins only once the waiting
// rank has failed (not after a fixed sleep), so a slow machine cannot make it arrive in time.
TEST(ShmAllReduce, StalledPeerTimesOutNamingIt) {
  std::string message;
  std::atomic<bool> waiting_rank_failed{false};
  run_ranks(
      2,
      [&](CommunicatorPtr c) {
        at::Tensor t = at::ones({768});
        if (c->rank() == 1) {
          for (int i = 0; i < 6000 && !waiting_rank_failed; ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
          try {
            c->all_reduce(t)->wait();  // may succeed: rank 0 had published its row
          } catch (const deepspeed::CommError&) {
          }
          return;
        }
        try {
          c->all_reduce(t)->wait();
        } catch (const deepspeed::CommError& e) {
          message = e.what();
        }
        waiting_rank_failed = true;
      },
      // The timeout also bounds the group's set-up (Gloo's pairs connect within it): 2 s failed
      // twice in parallel ctest runs on a loaded 2-core machine, 5 s leaves room.
      std::chrono::milliseconds(5000));
  EXPECT_NE(message.find("all_reduce of 768 elements (float) on rank 0 of 2 failed after"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("(timeout 5 s)"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 1 (pid"), std::string::npos) << message;
  EXPECT_NE(message.find("did not contribute in time"), std::string::npos) << message;
}

}  // namespace

}  // namespace shm_allreduce_test
