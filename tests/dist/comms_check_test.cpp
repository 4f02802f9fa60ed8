// The desync checker (with_comms_check, "comms_check": true, DS_COMMS_CHECK=1): matching calls
// run unchanged; a rank whose call differs, or that skips one, makes every rank raise a
// CommError naming it and both calls, within the collective timeout instead of hanging.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/torch.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "comm/checked_communicator.h"
#include "comm/gloo_communicator.h"
#include "deepspeed/comm.h"
#include "deepspeed/config.h"
#include "deepspeed/engine.h"
#include "deepspeed/pipe.h"
#include "deepspeed/topology.h"
#include "gpt/model.h"
#include "support/expect.h"
#include "support/fake_communicator.h"
#include "support/pipeline_gpt.h"
#include "support/ranks.h"
#include "support/training_run.h"

namespace comms_check_test {

namespace comm = deepspeed::comm;
using comm::CommunicatorPtr;

namespace {

using Clock = std::chrono::steady_clock;

// Runs body on `world` thread ranks, each with its communicator checked; returns each rank's
// CommError message ("" if it finished).
std::vector<std::string> run_checked(int world, const std::function<void(comm::Communicator&)>& body,
                                     std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  std::vector<std::string> errors(world);
  run_ranks(
      world,
      [&](CommunicatorPtr raw) {
        CommunicatorPtr c = comm::with_comms_check(raw);
        try {
          body(*c);
        } catch (const deepspeed::CommError& e) {
          errors[raw->rank()] = e.what();
        }
      },
      timeout);
  return errors;
}

void all_reduce(comm::Communicator& c, int64_t n) {
  at::Tensor t = at::ones({n});
  c.all_reduce(t)->wait();
}

void all_gather(comm::Communicator& c, int64_t n) {
  at::Tensor in = at::ones({n});
  at::Tensor out = at::empty({n * c.world_size()});
  c.all_gather(out, in)->wait();
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

// Every collective, many times (the store keys are recycled), with results as without checking.
TEST(CommsCheck, MatchingCallsRunUnchanged) {
  auto errors = run_checked(3, [](comm::Communicator& c) {
    const int w = c.world_size();
    for (int i = 0; i < 200; ++i) {
      at::Tensor t = at::full({5}, c.rank() + i, at::kFloat);
      c.all_reduce(t)->wait();
      EXPECT_TRUE(t.equal(at::full({5}, 3 + 3 * i, at::kFloat)));
    }
    at::Tensor b = at::full({4}, c.rank(), at::kLong);
    c.broadcast(b, 2)->wait();
    EXPECT_TRUE(b.equal(at::full({4}, 2, at::kLong)));
    at::Tensor in = at::full({2}, c.rank(), at::kFloat);
    at::Tensor out = at::empty({2 * w});
    c.all_gather(out, in)->wait();
    EXPECT_TRUE(out.equal(torch::tensor({0.f, 0.f, 1.f, 1.f, 2.f, 2.f})));
    at::Tensor rs = at::empty({2});
    c.reduce_scatter(rs, at::ones({2 * w}))->wait();
    EXPECT_TRUE(rs.equal(at::full({2}, 3.0)));
    at::Tensor rsv = at::empty({c.rank() == 1 ? 0 : 2});
    c.reduce_scatter_v(rsv, at::ones({4}), {2, 0, 2})->wait();
    EXPECT_TRUE(rsv.equal(at::full({rsv.numel()}, 3.0)));
    c.barrier();
    // Sub-groups of a checked communicator are checked too.
    CommunicatorPtr sub = c.split(c.rank() == 2 ? -1 : 0, c.rank());
    if (sub) {
      EXPECT_NE(dynamic_cast<comm::CheckedCommunicator*>(sub.get()), nullptr);
      at::Tensor s = at::ones({3});
      sub->all_reduce(s)->wait();
      EXPECT_TRUE(s.equal(at::full({3}, 2.0)));
    }
  });
  for (auto& e : errors) EXPECT_EQ(e, "");
}

TEST(CommsCheck, DifferentKindsRaiseOnEveryRankNamingBothCalls) {
  auto errors = run_checked(2, [](comm::Communicator& c) {
    all_reduce(c, 16);
    if (c.rank() == 1)
      all_gather(c, 1024);
    else
      all_reduce(c, 1024);
    ADD_FAILURE() << "rank " << c.rank() << " went on after a mismatched collective";
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(errors[r], "comms_check on rank " + std::to_string(r) +
                             " of 2: rank 1 issued all_gather #2 (float, 1024 elements) but rank "
                             "0 issued all_reduce #2 (float, 1024 elements, sum)");
}

TEST(CommsCheck, DifferentSizesAndDtypesAreNamed) {
  auto errors = run_checked(2, [](comm::Communicator& c) {
    at::Tensor t = at::ones({c.rank() == 0 ? 4 : 8}, c.rank() == 0 ? at::kFloat : at::kBFloat16);
    c.all_reduce(t, comm::ReduceOp::Max)->wait();
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(errors[r].find("rank 1 issued all_reduce #1 (bfloat16, 8 elements, max) but rank 0 "
                             "issued all_reduce #1 (float, 4 elements, max)"),
              std::string::npos)
        << errors[r];
}

// Rank 1 skips one all-reduce (a bucket it thought empty) and goes on to the all-gather: its
// next call meets the others' skipped one. Every rank raises at once, naming rank 1, well
// before the collective timeout; without the checker Gloo would mix the two calls' tensors or
// wait for the timeout.
TEST(CommsCheck, SkippedAllReduceIsNamedOnEveryRankNotAHang) {
  const auto timeout = std::chrono::seconds(10);
  const auto t0 = Clock::now();
  auto errors = run_checked(
      3,
      [](comm::Communicator& c) {
        all_reduce(c, 1024);
        if (c.rank() != 1) all_reduce(c, 1024);
        all_gather(c, 512);
        ADD_FAILURE() << "rank " << c.rank() << " went on after a skipped collective";
      },
      timeout);
  EXPECT_LT(seconds_since(t0), 5.0);
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(errors[r], "comms_check on rank " + std::to_string(r) +
                             " of 3: rank 1 issued all_gather #2 (float, 512 elements) but rank "
                             "0 issued all_reduce #2 (float, 1024 elements, sum)");
}

// The skipped call was the last one: nothing mismatches, rank 1 simply never arrives. Rank 0
// raises after the timeout, naming rank 1 and what it last issued.
TEST(CommsCheck, RankThatNeverArrivesIsNamedAfterTheTimeout) {
  const auto t0 = Clock::now();
  auto errors = run_checked(
      2,
      [](comm::Communicator& c) {
        all_reduce(c, 4);
        if (c.rank() == 0) all_reduce(c, 4);
      },
      std::chrono::seconds(2));
  const double took = seconds_since(t0);
  EXPECT_GE(took, 2.0);
  EXPECT_LT(took, 10.0);
  EXPECT_EQ(errors[0],
            "comms_check on rank 0 of 2: rank 0 issued all_reduce #2 (float, 4 elements, sum); "
            "rank 1 did not reach it within 2 s (its last collective was all_reduce #1 (float, 4 "
            "elements, sum))");
  EXPECT_EQ(errors[1], "");
}

// A second checker over the same communicator (build_engine wraps the world again for each
// engine) starts counting from 1 again: it must not read the first checker's keys. Here the
// first one's last call (all_reduce #3 of 4 elements) would be found as the slow rank 1's
// "#3" by rank 0's all_gather #3 of the second, a false mismatch on rank 0 while rank 1 waits.
TEST(CommsCheck, SecondCheckerOverTheSameCommunicatorStartsClean) {
  std::vector<std::string> errors(2);
  run_ranks(2, [&](CommunicatorPtr raw) {
    try {
      CommunicatorPtr a = comm::with_comms_check(raw);
      for (int i = 0; i < 3; ++i) all_reduce(*a, 4);
      CommunicatorPtr b = comm::with_comms_check(raw);
      auto slow = [&] {
        if (raw->rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
      };
      slow();
      all_reduce(*b, 4);
      slow();
      all_reduce(*b, 4);
      slow();
      all_gather(*b, 4);
    } catch (const deepspeed::CommError& e) {
      errors[raw->rank()] = e.what();
    }
  });
  for (auto& e : errors) EXPECT_EQ(e, "");
}

TEST(CommsCheck, MajorityDecidesWhoDiverges) {
  auto call = [](const char* kind, int64_t n) {
    comm::CallDesc d;
    d.kind = kind;
    d.seq = 3;
    d.dtype = "float";
    d.numel = n;
    return d;
  };
  EXPECT_EQ(comm::describe_mismatch({call("all_reduce", 4), call("all_reduce", 4)}), "");
  EXPECT_EQ(comm::describe_mismatch(
                {call("barrier", 0), call("all_reduce", 4), call("all_reduce", 4)}),
            "rank 0 issued barrier #3 (float, 0 elements) but rank 1 issued all_reduce #3 "
            "(float, 4 elements)");
  EXPECT_EQ(comm::describe_mismatch(
                {call("a", 1), call("b", 1), call("b", 1), call("c", 1)}),
            "rank 0 issued a #3 (float, 1 elements) but rank 1 issued b #3 (float, 1 elements); "
            "rank 3 issued c #3 (float, 1 elements)");
  comm::CallDesc d = call("reduce_scatter_v", 9);
  d.detail = "sum, splits 4+0+5";
  EXPECT_EQ(comm::CallDesc::decode(d.encode()), d);
}

TEST(CommsCheck, WrapsOnlyWhatItCanCheck) {
  CommunicatorPtr single = comm::make_single_process_communicator();
  EXPECT_EQ(comm::with_comms_check(single), single);
  CommunicatorPtr fake = std::make_shared<dstest::FakeCommunicator>(0, 2);
  EXPECT_THROW(comm::with_comms_check(fake), deepspeed::CommError);
  run_ranks(2, [](CommunicatorPtr raw) {
    CommunicatorPtr once = comm::with_comms_check(raw);
    EXPECT_NE(once, raw);
    EXPECT_EQ(comm::with_comms_check(once), once);
  });
}

TEST(CommsCheck, EnabledByEnvironmentOrConfig) {
  ::unsetenv("DS_COMMS_CHECK");
  EXPECT_FALSE(comm::comms_check_from_env());
  ::setenv("DS_COMMS_CHECK", "1", 1);
  EXPECT_TRUE(comm::comms_check_from_env());
  ::setenv("DS_COMMS_CHECK", "0", 1);
  EXPECT_FALSE(comm::comms_check_from_env());
  ::setenv("DS_COMMS_CHECK", "yes", 1);
  EXPECT_THROW(comm::comms_check_from_env(), deepspeed::ConfigError);
  ::unsetenv("DS_COMMS_CHECK");

  std::vector<std::string> warnings;
  auto cfg = deepspeed::parse_config({{"train_batch_size", 2}, {"comms_check", true}}, 2, {},
                                     &warnings);
  EXPECT_TRUE(cfg.comms_check);
  EXPECT_TRUE(warnings.empty());
  EXPECT_FALSE(deepspeed::parse_config({{"train_batch_size", 2}}, 2).comms_check);
}

namespace {
// What one rank's engine communicator was after training: whether it is the checker, how many
// collectives the checker compared (the sequence number of its last call, read back from the
// store where it leaves it: "comms_check/1/last/<rank>"), and the calls the communicator counted.
struct CheckSeen {
  bool checked = false;
  int64_t checked_calls = 0;
  int64_t all_gathers = 0, calls = 0;
};

CheckSeen check_seen(deepspeed::Engine& engine) {
  CheckSeen seen;
  const CommunicatorPtr c = engine.communicator();
  const auto stats = c->stats();
  for (const auto& [op, st] : stats) seen.calls += st.calls;
  if (auto it = stats.find("all_gather"); it != stats.end()) seen.all_gathers = it->second.calls;
  const auto* checked = dynamic_cast<const comm::CheckedCommunicator*>(c.get());
  seen.checked = checked != nullptr;
  if (!checked) return seen;
  auto store = comm::store_of(checked->inner());
  const std::string last = "comms_check/1/last/" + std::to_string(c->rank());
  if (store && store->check({last})) {
    const auto bytes = store->get(last);
    seen.checked_calls = comm::CallDesc::decode(std::string(bytes.begin(), bytes.end())).seq;
  }
  return seen;
}
}  // namespace

// An engine with "comms_check": true trains exactly as without (stage 3 with every block
// partitioned and released after use: the most collectives, the units' gathers issued from the
// forward and autograd hooks): the checker changes no result. The engine's communicator is the
// checker, and the checker compared every collective the communicator counted, the hooks'
// all-gathers included (with the default persistence threshold every parameter of the test GPT
// stays whole and no hook gathers anything).
TEST(CommsCheck, EngineTrainsBitIdenticallyWithTheCheck) {
  for (int stage : {0, 3}) {
    dstest::RunSpec spec;
    spec.world_size = 2;
    spec.steps = 3;
    spec.config = dstest::base_config(2, 2, stage);
    if (stage == 3) {
      spec.config["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
      spec.config["zero_optimization"]["stage3_max_reuse_distance"] = 0;
    }
    std::vector<CheckSeen> seen(2);
    spec.after_training = [&](deepspeed::Engine& e) { seen[e.communicator()->rank()] = check_seen(e); };
    const dstest::RunResult plain = dstest::train_gpt(spec);
    for (int r = 0; r < 2; ++r) EXPECT_FALSE(seen[r].checked) << "stage " << stage << " rank " << r;
    const std::vector<CheckSeen> unchecked = seen;
    spec.config["comms_check"] = true;
    const dstest::RunResult checked = dstest::train_gpt(spec);
    EXPECT_EQ(plain.losses, checked.losses) << "stage " << stage;
    EXPECT_EQ(dstest::max_weight_diff(plain, checked), 0.0) << "stage " << stage;
    for (int r = 0; r < 2; ++r) {
      EXPECT_TRUE(seen[r].checked) << "stage " << stage << " rank " << r;
      // The checker's sequence number counts the collectives it compared; the communicator's
      // stats count every collective it ran (79 at stage 0, 162 at stage 3, measured).
      EXPECT_EQ(seen[r].checked_calls, seen[r].calls) << "stage " << stage << " rank " << r;
      EXPECT_EQ(seen[r].calls, unchecked[r].calls) << "stage " << stage << " rank " << r;
      // Every block is released after use (reuse distance 0), so each of the 3 steps x 2
      // micro-steps gathers at least once in its forward (23 all-gathers measured).
      if (stage == 3) EXPECT_GE(seen[r].all_gathers, 3 * 2) << "rank " << r;
    }
  }
}

// A given topology's groups were split before initialize() sees the config: they are checked
// only when its world was wrapped first. Over a plain world the check would silently not
// happen, so initialize() refuses, naming the switch and the fix; over a checked world the
// engine's group is a checked one.
TEST(CommsCheck, GivenTopologyMustBeBuiltOverACheckedWorld) {
  auto model = [] { return std::make_shared<gpt::GPTImpl>(gpt::GPTConfig{64, 8, 1, 2, 8}); };
  auto checked_config = dstest::base_config(1, 1, 0);
  checked_config["comms_check"] = true;
  std::vector<std::string> refusals(2);
  run_ranks(2, [&](CommunicatorPtr raw) {
    auto plain = std::make_shared<comm::Topology>(raw);
    refusals[raw->rank()] = dstest::message_of<deepspeed::ConfigError>([&] {
      deepspeed::initialize<gpt::GPTImpl>(
          {.model = model(), .config_json = checked_config, .device = "cpu", .topology = plain});
    });
    auto checked = std::make_shared<comm::Topology>(comm::with_comms_check(raw));
    auto engine = deepspeed::initialize<gpt::GPTImpl>(
        {.model = model(), .config_json = checked_config, .device = "cpu", .topology = checked});
    EXPECT_NE(dynamic_cast<comm::CheckedCommunicator*>(engine.engine->communicator().get()),
              nullptr);
  });
  for (const auto& e : refusals) {
    EXPECT_CONTAINS(e, "\"comms_check\": true");
    EXPECT_CONTAINS(e, "InitializeArgs.topology");
    EXPECT_CONTAINS(e, "with_comms_check");
  }
  // The environment's switch too (its own name in the message).
  ::setenv("DS_COMMS_CHECK", "1", 1);
  std::vector<std::string> env_refusals(2);
  run_ranks(2, [&](CommunicatorPtr raw) {
    auto plain = std::make_shared<comm::Topology>(raw);
    env_refusals[raw->rank()] = dstest::message_of<deepspeed::ConfigError>([&] {
      deepspeed::initialize<gpt::GPTImpl>({.model = model(),
                                           .config_json = dstest::base_config(1, 1, 0),
                                           .device = "cpu",
                                           .topology = plain});
    });
  });
  ::unsetenv("DS_COMMS_CHECK");
  for (const auto& e : env_refusals) EXPECT_CONTAINS(e, "DS_COMMS_CHECK=1");
}

// A pipeline built by initialize_pipeline checks its world before splitting its groups, so
// the pipe group's collectives (here the world's: 2 stages of one rank) are checked, not only
// the data-parallel group's. The checker leaves each rank's last call under
// "comms_check/<k>/last/<rank>" in the world's store.
TEST(CommsCheck, PipelineChecksEveryGroup) {
  run_ranks(2, [&](CommunicatorPtr raw) {
    auto args = dstest::pipeline_args(raw, /*stages=*/2, /*zero_stage=*/0,
                                      dstest::tiny_pipeline_gpt(false));
    args.config_json["comms_check"] = true;
    auto engine = deepspeed::pipe::initialize_pipeline(args);
    dstest::train_pipeline_steps(*engine, raw, 0, 1);
    auto store = comm::store_of(*raw);
    ASSERT_TRUE(store);
    EXPECT_TRUE(store->check({"comms_check/1/last/" + std::to_string(raw->rank())}));
  });
  // A given topology over a plain world is refused, as by initialize().
  std::vector<std::string> refusals(2);
  run_ranks(2, [&](CommunicatorPtr raw) {
    auto args = dstest::pipeline_args(raw, /*stages=*/2, /*zero_stage=*/0,
                                      dstest::tiny_pipeline_gpt(false));
    args.config_json["comms_check"] = true;
    args.comm = nullptr;
    args.topology = std::make_shared<comm::Topology>(raw, comm::TopologySizes{2, 1});
    refusals[raw->rank()] = dstest::message_of<deepspeed::ConfigError>(
        [&] { deepspeed::pipe::initialize_pipeline(args); });
  });
  for (const auto& e : refusals) {
    EXPECT_CONTAINS(e, "\"comms_check\": true");
    EXPECT_CONTAINS(e, "PipelineInitializeArgs.topology");
  }
}

}  // namespace comms_check_test
