// Exact resume with dropout: the random numbers a resumed job draws are the uninterrupted job's.
// A checkpoint saved between accumulation boundaries drops the partial gradients and saves the
// loader's position at the last boundary, so the resumed job trains those micro-batches again;
// it must also draw their dropout masks again, so the RNG state saved is the one captured at that
// boundary (src/runtime/checkpoint_save.cpp). A save at a boundary saves the generator as it is
// then (the user may draw between step() and the save).
//
// The ranks here are threads, and threads share the process's one CPU generator: the training
// loop takes turns (rank 0's forward, then rank 1's forward, backward and step, then rank 0's
// next forward) so that the generator's draws come in one fixed order and every rank's boundary
// capture sees the same state. Stage 3 is left out at world 2: its forward gathers from both
// ranks, which the turns would deadlock.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "checkpoint/file_system.h"
#include "checkpoint/tag_reader.h"
#include "deepspeed/engine.h"
#include "gpt/model.h"
#include "support/files.h"
#include "support/ranks.h"
#include "support/training_run.h"

namespace rng_resume_test {

namespace {

constexpr int kAccumulation = 3;

gpt::GPTConfig model_with_dropout() {
  gpt::GPTConfig m{256, 16, 1, 2, 16};
  m.dropout = 0.3;
  return m;
}

// A counter the ranks' threads wait on in turn. A wait longer than a minute throws (the run then
// fails instead of hanging).
class Turns {
 public:
  void wait_for(int64_t turn) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::seconds(60), [&] { return turn_ >= turn; }))
      throw std::runtime_error("rng_resume_test: turn " + std::to_string(turn) + " never came");
  }
  void pass() {
    std::lock_guard<std::mutex> lock(mu_);
    ++turn_;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t turn_ = 0;
};

enum class SaveWhen { kAfterStep, kBeforeStep };

struct Job {
  int world = 1, stage = 0;
  int64_t until = 12;  // train until engine.micro_steps() reaches this
  std::string dir;
  // Saves tag "ck" once engine.micro_steps() equals save_at: after that step() (kAfterStep), or
  // after the backward of micro-step save_at, before its step() (kBeforeStep). -1: no save.
  int64_t save_at = -1;
  SaveWhen when = SaveWhen::kAfterStep;
  // Draws torch::rand just before and just after the save (kAfterStep), as a user might.
  bool draw_around_save = false;
  bool load = false;   // load tag "ck" from dir first
  uint64_t model_seed = 7;
};

struct Trained {
  std::vector<std::map<int64_t, double>> losses;  // [rank]: micro-step -> its forward's loss
  int64_t start = 0;                              // engine.micro_steps() after loading
  double draw_after_save = 0;  // the draw after the save; a loading job: its first draw
};

Trained train(const Job& job) {
  at::set_num_threads(1);
  std::vector<std::shared_ptr<gpt::GPTImpl>> models;  // built here: the generator is shared
  for (int r = 0; r < job.world; ++r) {
    torch::manual_seed(job.model_seed + 1000 * r);
    models.push_back(std::make_shared<gpt::GPTImpl>(model_with_dropout()));
  }
  torch::manual_seed(99);  // a loading job's masks must come from the checkpoint, not from here
  auto data = dstest::test_text_dataset(model_with_dropout().block_size);
  Trained out;
  out.losses.resize(job.world);
  Turns turns;
  const int last = job.world - 1;
  run_ranks(job.world, [&](deepspeed::comm::CommunicatorPtr comm) {
    const int rank = comm->rank();
    auto [engine, optimizer, loader, scheduler] = deepspeed::initialize<gpt::GPTImpl>(
        {.model = models[rank],
         .config_json = dstest::base_config(2, kAccumulation, job.stage),
         .training_data = data,
         .comm = comm});
    if (job.load) engine->load_checkpoint(job.dir, "ck");
    const int64_t start = engine->micro_steps();
    // Every rank has loaded (set the shared generator) before the first draw.
    turns.pass();
    turns.wait_for(job.world);
    if (job.load && rank == 0) {
      out.start = start;
      if (job.draw_around_save) out.draw_after_save = torch::rand({1}).item<double>();
    }
    auto save = [&] {
      if (job.draw_around_save && rank == 0) torch::rand({1});
      engine->save_checkpoint(job.dir, "ck");
      if (job.draw_around_save && rank == 0) out.draw_after_save = torch::rand({1}).item<double>();
    };
    while (engine->micro_steps() < job.until) {
      const int64_t m = engine->micro_steps();
      auto batch = loader->next();
      turns.wait_for(job.world + (m - start) * job.world + rank);
      auto loss = engine->forward(batch.data, batch.target);
      if (rank != last) turns.pass();
      out.losses[rank][m] = loss.item<double>();
      engine->backward(loss);
      if (job.when == SaveWhen::kBeforeStep && m == job.save_at) save();
      engine->step();
      if (job.when == SaveWhen::kAfterStep && engine->micro_steps() == job.save_at) save();
      if (rank == last) turns.pass();
    }
  });
  return out;
}

// The uninterrupted job (saving as `job` says) and the job resumed from its checkpoint in new
// engines with other initial weights; the resumed job's losses must be the uninterrupted one's
// from its first (replayed) micro-step on, bit for bit, on every rank.
void expect_exact_resume(Job job) {
  dstest::TempDir dir("ds_rng_resume");
  job.dir = dir.path();
  const Trained whole = train(job);
  Job resumed = job;
  resumed.save_at = -1;
  resumed.load = true;
  resumed.model_seed = 4242;
  const Trained again = train(resumed);
  const int64_t boundary = job.save_at / kAccumulation * kAccumulation;
  EXPECT_EQ(again.start, boundary);
  for (int r = 0; r < job.world; ++r) {
    ASSERT_EQ(again.losses[r].size(), static_cast<size_t>(job.until - boundary)) << "rank " << r;
    for (const auto& [m, loss] : again.losses[r])
      EXPECT_EQ(loss, whole.losses[r].at(m)) << "rank " << r << ", micro-step " << m;
  }
  if (job.draw_around_save) EXPECT_EQ(again.draw_after_save, whole.draw_after_save);
}

}  // namespace

// Outside the anonymous namespace: the fixture's base names it (this file's namespace keeps it
// apart in a unity batch; -Wsubobject-linkage).
struct Case {
  int world, stage;
};
void PrintTo(const Case& c, std::ostream* os) { *os << "world " << c.world << ", stage " << c.stage; }

class RngResume : public ::testing::TestWithParam<Case> {};

// Saved after micro-steps 3 and 4 (two of step 2's three; micro_steps() is 5): the resumed job
// trains micro-steps 3 and 4 again with the masks they drew, then continues as the uninterrupted
// job does.
TEST_P(RngResume, MidAccumulationSaveReplaysTheMasks) {
  Job job;
  job.world = GetParam().world;
  job.stage = GetParam().stage;
  job.save_at = 5;
  expect_exact_resume(job);
}

// Saved after micro-step 3's backward, before its step(): micro_steps() is still at the
// boundary, but that backward's gradients are dropped and its micro-batch is trained again, so
// the masks drawn for it must be drawn again.
TEST_P(RngResume, SaveBeforeTheFirstStepOfAnAccumulationReplaysTheMasks) {
  Job job;
  job.world = GetParam().world;
  job.stage = GetParam().stage;
  job.save_at = 3;
  job.when = SaveWhen::kBeforeStep;
  expect_exact_resume(job);
}

INSTANTIATE_TEST_SUITE_P(Checkpoint, RngResume,
                         ::testing::Values(Case{1, 0}, Case{1, 2}, Case{1, 3}, Case{2, 0},
                                           Case{2, 1}, Case{2, 2}),
                         [](const auto& info) {
                           return "world" + std::to_string(info.param.world) + "_stage" +
                                  std::to_string(info.param.stage);
                         });

// Saved at a boundary (after step 2) with a draw between step() and the save: the checkpoint
// holds the generator as it is at the save, so the resumed job's first draw is the one the
// uninterrupted job made right after its save, and training continues on the same masks.
TEST(RngResumeAtBoundary, TheStateAtTheSaveIsRestored) {
  Job job;
  job.save_at = 6;
  job.draw_around_save = true;
  expect_exact_resume(job);
}

// The CPU engine saves its CPU generator only ("cuda_rng_state" is written by CUDA engines).
TEST(RngResumeAtBoundary, ACpuEngineSavesNoCudaGeneratorState) {
  dstest::TempDir dir("ds_rng_resume");
  Job job;
  job.dir = dir.path();
  job.until = 3;
  job.save_at = 3;
  train(job);
  deepspeed::checkpoint::TagReader reader(deepspeed::checkpoint::posix_file_system(),
                                          dir / "ck");
  const auto& index = reader.file(reader.partition_file(0));
  EXPECT_NE(index.find("rng_state"), nullptr);
  EXPECT_EQ(index.find("cuda_rng_state"), nullptr);
}

}  // namespace rng_resume_test
