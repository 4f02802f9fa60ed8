// A failure on one rank of two (a gradient hook that throws on rank 1 only; an out-of-memory on
// one rank does the same). Before the failure board, rank 0 waited for the buckets rank 1 never
// reduced until the communication timeout, and a retry on rank 1 met rank 0's old collectives.
// Now rank 0's call fails as soon as rank 1 has posted, naming rank 1's error (far sooner than
// the timeout, while rank 1 is still connected: only the board can end that wait), and every
// later call on either rank says that the job cannot continue. A failure that issued no
// collective (a forward at stages 0-2) is retried on its rank alone, and training goes on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <mutex>
#include <stdexcept>

#include "deepspeed/deepspeed.h"
#include "deepspeed/pipe.h"
#include "gpt/pipeline_model.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/pipeline_gpt.h"
#include "support/ranks.h"
#include "support/stage3_models.h"
#include "support/swap_files.h"

namespace one_rank_failure_test {

namespace {

using dstest::OuterModelImpl;

// Long enough that a test passing on the timeout would say so in its messages.
constexpr std::chrono::seconds kTimeout{60};
// "At once": a failing call ends far sooner than kTimeout. A wait that ended only at the timeout
// (Gloo's "Timed out waiting ...", or a peer that gave up on its own timeout and closed its
// connections) runs kTimeout at least; the gap is wide so that a loaded machine cannot blur it.
constexpr double kAtOnceSeconds = 10;

class OneRankFailure : public ::testing::TestWithParam<int> {};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A rank's first failed call: its message and how long it ran.
struct Failure {
  std::string message;
  double seconds = 0;
};

// What `f` throws (a test failure when nothing), and how long it ran.
Failure failure_of(const std::function<void()>& f) {
  const auto start = std::chrono::steady_clock::now();
  std::string message = dstest::message_of<std::exception>(f);
  return {std::move(message), seconds_since(start)};
}

// Holds every rank (its engine, so its communicator and its connections) until all have arrived.
// A rank that returned would close its connections, and a peer still waiting on it would fail on
// that ("connection closed") however late the failure board told it: the board is under test.
class AllArrived {
 public:
  explicit AllArrived(int ranks) : left_(ranks) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mu_);
    if (--left_ == 0) all_.notify_all();
    // Bounded: a rank that never arrives fails the test instead of hanging it.
    EXPECT_TRUE(all_.wait_for(lock, 3 * kTimeout, [&] { return left_ == 0; }))
        << "a rank never arrived";
  }

 private:
  std::mutex mu_;
  std::condition_variable all_;
  int left_;
};

// Gloo writes "Timed out", c10d "timed out": either means the wait ran into the timeout.
bool says_timed_out(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text.find("timed out") != std::string::npos;
}

// Made here, not in the rank threads, which would share the global generator.
std::vector<std::shared_ptr<OuterModelImpl>> make_models() {
  torch::manual_seed(11);
  return {std::make_shared<OuterModelImpl>(), std::make_shared<OuterModelImpl>()};
}

// After a one-rank failure: each rank's failed call ended at once, not at a timeout, and each
// rank's retried `call` says that the job cannot continue.
void expect_the_job_ended(const std::vector<Failure>& first,
                          const std::vector<std::string>& retried, const std::string& call) {
  for (int r = 0; r < 2; ++r) {
    EXPECT_CONTAINS(retried[r], call + " on rank " + std::to_string(r) + " of 2: ");
    EXPECT_CONTAINS(retried[r], "the job cannot continue");
    EXPECT_FALSE(says_timed_out(first[r].message)) << first[r].message;
    EXPECT_LT(first[r].seconds, kAtOnceSeconds)
        << "rank " << r << "'s failed call ran " << first[r].seconds << " s (timeout "
        << kTimeout.count() << " s): " << first[r].message;
  }
}

auto engine_for(const std::shared_ptr<OuterModelImpl>& model, const nlohmann::json& config,
                deepspeed::comm::CommunicatorPtr comm) {
  return deepspeed::initialize<OuterModelImpl>(
             {.model = model, .config_json = config, .comm = std::move(comm)})
      .engine;
}

TEST_P(OneRankFailure, ItsPeerFailsAtOnceAndNeitherGoesOn) {
  const int stage = GetParam();
  auto config = dstest::stage3_test_config(stage);  // buckets of 2000 elements, overlap_comm
  at::set_num_threads(1);
  std::vector<Failure> first(2);
  std::vector<std::string> retried(2);
  AllArrived alive(2);
  auto models = make_models();
  run_ranks(
      2,
      [&](deepspeed::comm::CommunicatorPtr comm) {
        const int rank = comm->rank();
        auto& model = models[rank];
        auto engine = engine_for(model, config, comm);
        // The first layer's gradient comes last but for the embedding's: the later layers'
        // buckets are already launched when it throws.
        bool fail = false;
        model->named_parameters()["layers.0.fc.weight"].register_hook([&](const at::Tensor& g) {
          if (fail) throw std::runtime_error("injected failure on rank 1");
          return g;
        });
        for (int64_t micro = 0; micro < 2; ++micro) {
          auto b = dstest::token_batch(rank, micro);
          fail = micro == 1 && rank == 1;
          auto loss = engine->forward(b.idx, b.targets);
          const auto start = std::chrono::steady_clock::now();
          try {
            engine->backward(loss);
            engine->step();
          } catch (const std::exception& e) {
            first[rank] = {e.what(), seconds_since(start)};
            break;
          }
        }
        // The retry a program catching an out-of-memory would make, on either rank.
        try {
          auto b = dstest::token_batch(rank, 1);
          engine->backward(engine->forward(b.idx, b.targets));
        } catch (const std::exception& e) {
          retried[rank] = e.what();
        }
        alive.arrive_and_wait();  // rank 1 stays connected while rank 0 waits in its buckets
      },
      kTimeout);
  EXPECT_CONTAINS(first[1].message, "injected failure on rank 1");
  EXPECT_CONTAINS(first[0].message, "rank 1's backward failed (");
  EXPECT_CONTAINS(first[0].message, "injected failure on rank 1");
  EXPECT_CONTAINS(first[0].message, "so it will never join it; the job cannot continue");
  expect_the_job_ended(first, retried, "forward");
}

// Stage 3's forward gathers its units: one that throws on one rank (here at its loss, after
// every unit was gathered and released) has issued collectives, so its peer, already in
// backward, fails at once, and neither goes on.
TEST(OneRankFailure, AStageThreeForwardThatThrewEndsTheJob) {
  auto config = dstest::stage3_test_config(3);
  at::set_num_threads(1);
  std::vector<Failure> first(2);
  std::vector<std::string> retried(2);
  AllArrived alive(2);
  auto models = make_models();
  run_ranks(
      2,
      [&](deepspeed::comm::CommunicatorPtr comm) {
        const int rank = comm->rank();
        auto engine = engine_for(models[rank], config, comm);
        auto b = dstest::token_batch(rank, 0);
        first[rank] = failure_of([&] {
          auto targets = rank == 1 ? b.targets.narrow(1, 0, 1) : b.targets;  // bad shape
          engine->backward(engine->forward(b.idx, targets));
          engine->step();
        });
        try {
          engine->backward(engine->forward(b.idx, b.targets));
        } catch (const std::exception& e) {
          retried[rank] = e.what();
        }
        alive.arrive_and_wait();  // rank 1 stays connected while rank 0 waits in its backward
      },
      kTimeout);
  EXPECT_CONTAINS(first[0].message, "rank 1's forward failed (");
  expect_the_job_ended(first, retried, "forward");
}

// Stage 3's forward gathers units (collectives), so a forward that throws there posts; at stages
// 0-2 it issues none, and its rank alone retries it.
class ForwardRetry : public ::testing::TestWithParam<int> {};

TEST_P(ForwardRetry, AForwardThatIssuedNothingIsRetriedOnItsRankAlone) {
  const int stage = GetParam();
  auto config = dstest::stage3_test_config(stage);
  at::set_num_threads(1);
  std::vector<std::vector<double>> losses(2);
  std::mutex mu;
  for (const bool inject : {false, true}) {
    auto models = make_models();
    run_ranks(
        2,
        [&](deepspeed::comm::CommunicatorPtr comm) {
          const int rank = comm->rank();
          auto engine = engine_for(models[rank], config, comm);
          std::vector<double> mine;
          for (int64_t micro = 0; micro < 3; ++micro) {
            auto b = dstest::token_batch(rank, micro);
            if (inject && rank == 1 && micro == 1)
              EXPECT_ANY_THROW(engine->forward(b.idx, b.targets.narrow(1, 0, 1)));  // bad shape
            engine->backward(engine->forward(b.idx, b.targets));
            engine->step();
            mine.push_back(engine->last_loss());
          }
          std::lock_guard<std::mutex> lock(mu);
          if (!inject) losses[rank] = mine;
          else EXPECT_EQ(mine, losses[rank]) << "rank " << rank;
        },
        kTimeout);
  }
}

namespace {

// Two pipeline stages train a batch whose data iterator throws `what` on rank `failing_rank` at
// its micro-batch `at`, then a second batch: what each rank's first and second calls threw.
struct TwoBatches {
  std::vector<Failure> first = std::vector<Failure>(2);
  std::vector<std::string> retried = std::vector<std::string>(2);
};
TwoBatches pipeline_batches_failing(int failing_rank, int at, const std::string& what) {
  TwoBatches out;
  AllArrived alive(2);
  run_ranks(
      2,
      [&](deepspeed::comm::CommunicatorPtr comm) {
        namespace dp = deepspeed::pipe;
        dp::PipelineInitializeArgs args;
        args.model = gpt::gpt_pipeline(dstest::tiny_pipeline_gpt(false));
        args.model.num_stages = 2;
        args.config_json = dstest::pipeline_config(1, 0);
        args.comm = comm;
        args.device = "cpu";
        auto engine = dp::initialize_pipeline(args);
        int m = 0;
        auto data = [&] {
          if (comm->rank() == failing_rank && m == at) throw std::runtime_error(what);
          return dstest::pipeline_micro_batch(0, m++);
        };
        out.first[comm->rank()] = failure_of([&] { engine->train_batch(data); });
        m = 0;
        try {
          engine->train_batch([&] { return dstest::pipeline_micro_batch(0, m++); });
        } catch (const std::exception& e) {
          out.retried[comm->rank()] = e.what();
        }
        alive.arrive_and_wait();  // the failed stage stays connected while its neighbour waits
      },
      kTimeout);
  return out;
}

}  // namespace

// Two pipeline stages: the last one fails loading its labels midway through a batch, so the
// first waits for a gradient (a point-to-point receive) that will never come. It is aborted as
// soon as the last stage has posted, naming its error; neither stage's next batch runs.
TEST(OneRankFailure, APipelineStageWaitingForAFailedStageFailsAtOnce) {
  const auto [first, retried] = pipeline_batches_failing(1, 3, "injected failure loading labels");
  EXPECT_CONTAINS(first[1].message, "injected failure loading labels");
  EXPECT_CONTAINS(first[0].message, "rank 1's train_batch failed (");
  EXPECT_CONTAINS(first[0].message, "injected failure loading labels");
  EXPECT_CONTAINS(first[0].message, "messages to rank 0");
  expect_the_job_ended(first, retried, "train_batch");
}

// The first stage fails on its first micro-batch (a finite data iterator at its end), before it
// sent anything: the next stage, already waiting for that activation, fails at once naming the
// error (before, a call that had issued nothing did not post, and it waited until the timeout).
TEST(OneRankFailure, APipelineStageFailingBeforeItsFirstTransferEndsItsNeighboursWait) {
  const auto [first, retried] = pipeline_batches_failing(0, 0, "injected end of the data");
  EXPECT_CONTAINS(first[0].message, "injected end of the data");
  EXPECT_CONTAINS(first[1].message, "rank 0's train_batch failed (");
  EXPECT_CONTAINS(first[1].message, "injected end of the data");
  expect_the_job_ended(first, retried, "train_batch");
}

// The end of a gathered_parameters scope with a modifier rank is collective: unit by unit, the
// modifier's values are broadcast and become the masters. Rank 1's swapped optimizer state is cut
// short under it, so its release fails reading the first unit's masters, after that unit's
// broadcast; rank 0, already in the next unit's broadcast, fails at once, naming rank 1's error
// (before the release was an engine call, it waited until the timeout).
TEST(OneRankFailure, AGatheredParametersReleaseThatFailsOnOneRankEndsItsPeersWait) {
  at::set_num_threads(1);
  std::vector<Failure> first(2);
  std::vector<std::string> retried(2);
  AllArrived alive(2);
  dstest::TempDir swap[2];
  auto models = make_models();
  run_ranks(
      2,
      [&](deepspeed::comm::CommunicatorPtr comm) {
        const int rank = comm->rank();
        auto config = dstest::stage3_test_config(3);
        config["zero_optimization"]["offload_optimizer"] = {{"device", "nvme"},
                                                            {"nvme_path", swap[rank].path()}};
        config["zero_optimization"]["sub_group_size"] = 1000;
        auto engine = engine_for(models[rank], config, comm);
        auto b = dstest::token_batch(rank, 0);
        engine->backward(engine->forward(b.idx, b.targets));
        engine->step();
        auto scope = engine->gathered_parameters(/*modifier_rank=*/0);
        if (rank == 0) {  // an edit of every unit: only what changed is written into the masters
          torch::NoGradGuard no_grad;
          for (auto& p : models[rank]->parameters()) p.add_(0.01);
        }
        if (rank == 1)  // the swap files are unlinked: reached through their descriptors
          for (auto& f : dstest::unlinked_files_in(swap[rank].path()))
            std::filesystem::resize_file(f, 0);
        first[rank] = failure_of([&] { scope.release(); });
        retried[rank] = dstest::message_of<std::exception>(
            [&] { engine->backward(engine->forward(b.idx, b.targets)); });
        alive.arrive_and_wait();  // rank 1 stays connected while rank 0 waits in its broadcast
      },
      kTimeout);
  EXPECT_CONTAINS(first[1].message, swap[1].path());
  EXPECT_CONTAINS(first[0].message, "rank 1's gathered_parameters (release) failed (");
  EXPECT_CONTAINS(first[0].message, swap[1].path());
  expect_the_job_ended(first, retried, "forward");
}

INSTANTIATE_TEST_SUITE_P(Stages, OneRankFailure, ::testing::Values(0, 1, 2, 3),
                         [](const auto& info) { return "stage" + std::to_string(info.param); });
INSTANTIATE_TEST_SUITE_P(Stages, ForwardRetry, ::testing::Values(0, 1, 2),
                         [](const auto& info) { return "stage" + std::to_string(info.param); });

}  // namespace

}  // namespace one_rank_failure_test
