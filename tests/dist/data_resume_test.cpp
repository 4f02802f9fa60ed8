// The engine's own loader (`training_data`) through training, epoch ends and checkpoint resumes,
// by the samples each step trains: the default keeps the last, partial micro-batch of an epoch on
// every rank alike; a resume continues with the samples the uninterrupted job would train next,
// at the same world size and micro batch (the exact position) and at another micro batch x
// world size (the position rescaled by samples consumed, src/runtime/checkpoint_load.cpp), also
// when the save is at an epoch's end.
#include <gtest/gtest.h>

#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "deepspeed/engine.h"
#include "gpt/model.h"
#include "support/files.h"
#include "support/ranks.h"
#include "support/training_run.h"

namespace data_resume_test {

namespace {
const gpt::GPTConfig kModel{256, 10, 1, 2, 14};  // block 10: the first 40 windows differ (at 9 two do)

// The first n windows of the test text: small enough to cross epoch ends within a few steps.
class Prefix : public deepspeed::Dataset {
 public:
  Prefix(std::shared_ptr<deepspeed::Dataset> base, int64_t n) : base_(std::move(base)), n_(n) {}
  int64_t size() const override { return n_; }
  deepspeed::Sample get(int64_t i) const override { return base_->get(i); }

 private:
  std::shared_ptr<deepspeed::Dataset> base_;
  int64_t n_;
};

using Sample = std::vector<int64_t>;      // one window's tokens
using MicroBatch = std::vector<Sample>;   // in the loader's order
using Step = std::multiset<Sample>;       // what one optimizer step trained, over all ranks

MicroBatch rows(const at::Tensor& data) {
  MicroBatch out;
  for (int64_t i = 0; i < data.size(0); ++i) {
    at::Tensor row = data[i].contiguous();
    out.emplace_back(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel());
  }
  return out;
}

struct Job {
  int world = 2, micro = 2, accumulation = 1;
  int64_t samples = 40;    // dataset size
  bool drop_last = false;  // dataloader_drop_last
  int steps = 4;           // train until global_steps reaches this
  std::string dir;         // checkpoints: saved as tag "s<step>" at the steps in save_at
  std::set<int> save_at;
  std::string load_tag;    // non-empty: load it from dir first
};

struct Trained {
  std::vector<std::vector<MicroBatch>> micro;  // [rank]: the micro-batches trained after loading
  std::vector<Step> steps;                     // each optimizer step after loading
  std::vector<deepspeed::LoaderState> loaded;  // [rank]: the loader's position after loading
};

nlohmann::json with_drop_last(nlohmann::json config, bool drop_last) {
  config["dataloader_drop_last"] = drop_last;
  return config;
}

Trained train(const Job& job) {
  at::set_num_threads(1);
  std::vector<std::shared_ptr<gpt::GPTImpl>> models;  // built here: the global RNG is not per-thread
  for (int r = 0; r < job.world; ++r) {
    torch::manual_seed(7 + 1000 * r);
    models.push_back(std::make_shared<gpt::GPTImpl>(kModel));
  }
  auto data = std::make_shared<Prefix>(dstest::test_text_dataset(kModel.block_size), job.samples);
  Trained out;
  out.micro.resize(job.world);
  out.loaded.resize(job.world);
  std::vector<std::vector<Step>> steps(job.world);
  run_ranks(job.world, [&](deepspeed::comm::CommunicatorPtr comm) {
    const int rank = comm->rank();
    auto [engine, optimizer, loader, scheduler] = deepspeed::initialize<gpt::GPTImpl>(
        {.model = models[rank],
         .config_json = with_drop_last(dstest::base_config(job.micro, job.accumulation, 1),
                                       job.drop_last),
         .training_data = data,
         .comm = comm});
    if (!job.load_tag.empty()) engine->load_checkpoint(job.dir, job.load_tag);
    out.loaded[rank] = loader->state();
    Step step;
    while (engine->global_steps() < job.steps) {
      auto batch = loader->next();
      out.micro[rank].push_back(rows(batch.data));
      step.insert(out.micro[rank].back().begin(), out.micro[rank].back().end());
      engine->backward(engine->forward(batch.data, batch.target));
      const bool boundary = engine->is_gradient_accumulation_boundary();
      engine->step();
      if (!boundary) continue;
      steps[rank].push_back(std::move(step));
      step.clear();
      if (job.save_at.count(static_cast<int>(engine->global_steps())))
        engine->save_checkpoint(job.dir, "s" + std::to_string(engine->global_steps()));
    }
  });
  for (int r = 0; r < job.world; ++r) {
    EXPECT_EQ(steps[r].size(), steps[0].size()) << "rank " << r;
    out.steps.resize(steps[r].size());
    for (size_t i = 0; i < steps[r].size(); ++i) out.steps[i].insert(steps[r][i].begin(), steps[r][i].end());
  }
  return out;
}

std::vector<int64_t> sizes(const std::vector<MicroBatch>& micro) {
  std::vector<int64_t> out;
  for (auto& m : micro) out.push_back(static_cast<int64_t>(m.size()));
  return out;
}

// Steps [from, from + n) of a run.
std::vector<Step> slice(const std::vector<Step>& steps, size_t from, size_t n) {
  EXPECT_LE(from + n, steps.size());
  if (from + n > steps.size()) return {};
  return {steps.begin() + from, steps.begin() + from + n};
}

// Removes the saved data_sampler's "dataset_size" and "drop_last" from tag `tag`'s model states,
// as checkpoints saved before them were.
void strip_saved_epoch_layout(const std::string& save_dir, const std::string& tag) {
  namespace ckpt = deepspeed::checkpoint;
  const std::string dir = save_dir + "/" + tag;
  auto& fs = ckpt::posix_file_system();
  ckpt::Manifest manifest = ckpt::read_manifest(fs, dir);
  int stripped = 0;
  for (auto& [name, entry] : manifest.files) {
    if (name.find("model_states") == std::string::npos) continue;
    const std::string path = dir + "/" + name;
    auto file = ckpt::read_safetensors(path);
    nlohmann::json meta = nlohmann::json::parse(file.metadata.at(ckpt::kMetadataKey));
    stripped += static_cast<int>(meta.at("data_sampler").erase("dataset_size"));
    stripped += static_cast<int>(meta.at("data_sampler").erase("drop_last"));
    file.metadata[ckpt::kMetadataKey] = meta.dump();
    ckpt::write_safetensors(path, file.tensors, file.metadata);
    entry = ckpt::describe_file(fs, path);
  }
  ASSERT_EQ(stripped, 2) << "no model states file held both fields";
  ckpt::write_manifest(fs, dir, manifest);
}

// `saved` run again from its checkpoint of step `at` (saving none) at `world` ranks of `micro`
// samples and an accumulation of `accumulation`.
Job resumed_from(Job saved, int at, int world, int micro, int accumulation = 1) {
  saved.world = world;
  saved.micro = micro;
  saved.accumulation = accumulation;
  saved.save_at = {};
  saved.load_tag = "s" + std::to_string(at);
  return saved;
}

// Every rank's loader resumed at batch `batch_in_epoch` of epoch `epoch`.
void expect_resumed_at(const Trained& r, int64_t epoch, int64_t batch_in_epoch) {
  for (size_t rank = 0; rank < r.loaded.size(); ++rank) {
    EXPECT_EQ(r.loaded[rank].epoch, epoch) << "rank " << rank;
    EXPECT_EQ(r.loaded[rank].batch_in_epoch, batch_in_epoch) << "rank " << rank;
  }
}

// A one-rank job of `samples` windows in micro-batches of `micro`, saved after step 2 (the end of
// epoch 0), resumed at micro-batches of 3: it must resume at epoch 1's start and train epoch 1's
// first three samples, as the uninterrupted run's third step begins with.
void expect_epoch_end_resume_at_micro_3(int64_t samples, int micro, bool drop_last) {
  dstest::TempDir dir;
  // Epoch 0 is steps 1-2.
  const Job whole{.world = 1, .micro = micro, .samples = samples, .drop_last = drop_last, .steps = 3,
                  .dir = dir.path(), .save_at = {2}};
  const Trained straight = train(whole);
  const Trained s = train(resumed_from(whole, /*at=*/2, /*world=*/1, /*micro=*/3));
  expect_resumed_at(s, 1, 0);
  ASSERT_FALSE(s.micro[0].empty());
  const MicroBatch& next_epoch = straight.micro[0].at(2);  // epoch 1's first micro-batch
  EXPECT_EQ(s.micro[0][0], MicroBatch(next_epoch.begin(), next_epoch.begin() + 3));
}
}  // namespace

// The comparisons below are by window contents: the windows must differ.
TEST(DataResume, TheTestWindowsAreDistinct) {
  auto data = dstest::test_text_dataset(kModel.block_size);
  std::set<Sample> seen;
  for (int64_t i = 0; i < 40; ++i) seen.insert(rows(data->get(i).data.unsqueeze(0))[0]);
  EXPECT_EQ(seen.size(), 40u);
}

// 13 samples at world 2, micro 3: the sampler pads each rank's shard to 7 (one sample repeated),
// so both ranks take micro-batches of 3, 3 and 1 per epoch and stay in step across the epoch end
// (a rank with one micro-batch more would leave the other's all-reduce waiting). With an
// accumulation of 2 a step spans the epoch end. dataloader_drop_last is not given: false.
TEST(DataResume, DefaultKeepsThePartialLastMicroBatchOnEveryRank) {
  for (int accumulation : {1, 2}) {
    const Trained r = train({.world = 2, .micro = 3, .accumulation = accumulation, .samples = 13,
                             .steps = accumulation == 1 ? 5 : 3});
    const std::vector<int64_t> want =
        accumulation == 1 ? std::vector<int64_t>{3, 3, 1, 3, 3} : std::vector<int64_t>{3, 3, 1, 3, 3, 1};
    for (int rank = 0; rank < 2; ++rank)
      EXPECT_EQ(sizes(r.micro[rank]), want) << "rank " << rank << " accumulation " << accumulation;
    // The first epoch (3 micro-batches per rank) trained every sample, one of them twice (the pad).
    std::set<Sample> epoch;
    for (int rank = 0; rank < 2; ++rank)
      for (int k = 0; k < 3; ++k) epoch.insert(r.micro[rank][k].begin(), r.micro[rank][k].end());
    EXPECT_EQ(epoch.size(), 13u) << "accumulation " << accumulation;
  }
}

// Saved at world 2, micro 2 (4 samples a step) after 3 steps; resumed at world 1, micro 2 with
// an accumulation of 2 (the same 4 samples a step): the position rescales from batch 3 to batch
// 6 and every later step trains the samples of the uninterrupted job's step.
TEST(DataResume, AnotherMicroBatchTimesWorldResumesAtTheSamplesConsumed) {
  dstest::TempDir dir;
  const Job first{.world = 2, .micro = 2, .steps = 7, .dir = dir.path(), .save_at = {3}};
  const Trained uninterrupted = train(first);
  ASSERT_EQ(uninterrupted.steps.size(), 7u);

  const Trained r = train(resumed_from(first, /*at=*/3, /*world=*/1, /*micro=*/2, /*accumulation=*/2));
  expect_resumed_at(r, 0, 6);
  EXPECT_EQ(r.steps, slice(uninterrupted.steps, 3, 4));
}

// 13 samples at world 2, micro 3: 3 steps an epoch. Saved mid-epoch (step 2) and at the epoch's
// end (step 3), resumed at the same world size and micro batch: each rank trains exactly the
// micro-batches of the uninterrupted job, across the epoch ends.
TEST(DataResume, ASaveAtOrBeforeAnEpochEndResumesTheSameBatches) {
  dstest::TempDir dir;
  const Job first{.world = 2, .micro = 3, .samples = 13, .steps = 7, .dir = dir.path(),
                  .save_at = {2, 3}};
  const Trained uninterrupted = train(first);
  ASSERT_EQ(uninterrupted.micro[0].size(), 7u);
  for (int at : {2, 3}) {
    const Trained r = train(resumed_from(first, at, /*world=*/2, /*micro=*/3));
    for (int rank = 0; rank < 2; ++rank) {
      const std::vector<MicroBatch> want(uninterrupted.micro[rank].begin() + at, uninterrupted.micro[rank].end());
      EXPECT_EQ(r.micro[rank], want) << "resumed from step " << at << ", rank " << rank;
    }
  }
}

// Saved at an epoch's end and resumed at another micro batch x world size, the job starts the
// next epoch: its steps are the uninterrupted job's next ones (world 2 -> world 1, steps 4-5; after
// that the epochs' padding differs). And a job whose epoch end does not fall on a whole number of
// the new job's micro-batches (10 samples: micro 5 -> micro 3, 10 / 3 rounds down to batch 3)
// starts the next epoch too. Before, that one resumed at batch 3 of the finished epoch and
// trained its last sample again.
TEST(DataResume, ASaveAtAnEpochEndResumesAtTheNextEpochAtAnotherMicroBatch) {
  dstest::TempDir dir;
  const Job first{.world = 2, .micro = 3, .samples = 13, .steps = 5, .dir = dir.path(), .save_at = {3}};
  const Trained uninterrupted = train(first);
  const Trained r = train(resumed_from(first, /*at=*/3, /*world=*/1, /*micro=*/3, /*accumulation=*/2));
  EXPECT_EQ(r.steps, slice(uninterrupted.steps, 3, 2));

  expect_epoch_end_resume_at_micro_3(/*samples=*/10, /*micro=*/5, /*drop_last=*/false);
}

// With dataloader_drop_last the epoch ends before its tail: 10 samples in micro-batches of 4 is
// 2 batches (8 samples), and a save after them resumes at micro 3 in the next epoch, not at
// epoch 0's third batch of 3 (samples 6-8, two of them trained already and one dropped).
TEST(DataResume, WithDropLastASaveAtAnEpochEndResumesAtTheNextEpoch) {
  expect_epoch_end_resume_at_micro_3(/*samples=*/10, /*micro=*/4, /*drop_last=*/true);
}

// With dataloader_drop_last the sampler still pads each rank's shard to ceil(N / world) (as
// DeepSpeed's DistributedSampler; drop_last goes to the loader alone): 11 samples at world 2,
// micro 3 is a shard of 6, 2 micro-batches a step each. Saved after step 1 and resumed at world 1
// (accumulation 2, the same 6 samples a step), the job continues in epoch 0 at batch 2, with the
// samples of the uninterrupted job's step 2. Before, the saved job's epoch was taken as
// floor(11 / 2) = 5 samples a rank, 1 micro-batch: the save looked like the epoch's end and the
// resume started epoch 1, never training step 2's samples.
TEST(DataResume, WithDropLastAMidEpochSaveResumesInTheEpochAtAnotherWorldSize) {
  dstest::TempDir dir;
  const Job first{.world = 2, .micro = 3, .samples = 11, .drop_last = true, .steps = 2, .dir = dir.path(),
                  .save_at = {1}};
  const Trained uninterrupted = train(first);
  ASSERT_EQ(uninterrupted.steps.size(), 2u);
  const Trained r = train(resumed_from(first, /*at=*/1, /*world=*/1, /*micro=*/3, /*accumulation=*/2));
  expect_resumed_at(r, 0, 2);
  ASSERT_FALSE(r.micro[0].empty());
  for (const Sample& sample : r.micro[0][0])
    EXPECT_EQ(uninterrupted.steps[1].count(sample), 1u) << "a sample outside the uninterrupted step 2";
}

// The same samples a step (world 1 x micro 6 and world 2 x micro 3) but, with
// dataloader_drop_last, not the same micro-batches an epoch: 11 samples are 1 batch of 6 at world
// 1 (the tail of 5 dropped) and 2 steps at world 2 (shards of 6, padded). A save after world 1's
// only batch resumes at world 2 at epoch 1's start, training what the uninterrupted job's step 2
// trains. Before, the exact position (epoch 0, batch 1) was kept: world 2 trained epoch 0's
// dropped tail.
TEST(DataResume, WithDropLastASaveAtAnEpochEndResumesAtTheNextEpochAtTheSameStepSize) {
  dstest::TempDir dir;
  const Job first{.world = 1, .micro = 6, .samples = 11, .drop_last = true, .steps = 2, .dir = dir.path(),
                  .save_at = {1}};
  const Trained uninterrupted = train(first);
  const Trained r = train(resumed_from(first, /*at=*/1, /*world=*/2, /*micro=*/3));
  ASSERT_EQ(r.loaded.size(), 2u);
  expect_resumed_at(r, 1, 0);
  EXPECT_EQ(r.steps, slice(uninterrupted.steps, 1, 1));
}

// The saved job's epoch is cut by its own dataloader_drop_last, saved with its position: 10
// samples in micro-batches of 4 without drop_last are 3 batches (4, 4, 2), so a save after 2 is
// mid-epoch, also for a job resumed with drop_last (at micro 3: batch 8 / 3 = 2). Before, the
// resuming job's drop_last was assumed (2 batches of 4: the epoch's end) and the last 2 samples
// of epoch 0 were skipped. A checkpoint without the saved flag (an older one) still loads, taking
// the resuming job's, as before.
TEST(DataResume, TheSavedJobsDropLastDecidesWhereItsEpochEnds) {
  dstest::TempDir dir;
  const Job first{.world = 1, .micro = 4, .samples = 10, .steps = 2, .dir = dir.path(), .save_at = {2}};
  train(first);
  Job resumed = resumed_from(first, /*at=*/2, /*world=*/1, /*micro=*/3);
  resumed.drop_last = true;
  resumed.steps = 3;
  expect_resumed_at(train(resumed), 0, 2);

  strip_saved_epoch_layout(dir.path(), "s2");
  expect_resumed_at(train(resumed), 1, 0);
}

}  // namespace data_resume_test
