// Exact resume: training 20 steps while saving at step 10, then resuming from step 10 in a fresh
// job (new engines, differently initialised models) gives bit-identical losses for steps 11-20 and
// identical final weights, at the same world size and ZeRO stage. Exactness holds because the
// resumed job restores every input of the step: fp32 masters and Adam moments bit for bit, the
// Adam step, the LR schedule position, the loss scaler, the data position and the RNG state.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <functional>

#include "checkpoint/fault_injecting_file_system.h"
#include "checkpoint/tag_reader.h"
#include "deepspeed/errors.h"
#include "runtime/engine_checkpoint.h"
#include "support/checkpoint_run.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/ranks.h"
#include "support/training_run.h"

namespace checkpoint_resume_test {

using dstest::CheckpointJob;
using dstest::run_checkpoint_job;

// Outside the anonymous namespace: the fixture's base names it (this file's namespace keeps it
// apart in a unity batch; -Wsubobject-linkage).
struct Case {
  int world;
  int stage;
  const char* optimizer;  // "AdamW" or "SGD" (momentum buffers): both saved as fragments
  bool bf16 = false;      // bf16 model with fp32 masters (stage 0 then runs PartitionedStage)
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << "world " << c.world << ", stage " << c.stage << ", " << c.optimizer << (c.bf16 ? ", bf16" : "");
}

namespace {

nlohmann::json config_for(const Case& c) {
  auto config = dstest::base_config(1, 2, c.stage);
  config["gradient_clipping"] = 0.5;
  config["scheduler"] = {{"type", "WarmupLR"},
                         {"params", {{"warmup_min_lr", 0.0}, {"warmup_max_lr", 3e-3}, {"warmup_num_steps", 15}}}};
  if (c.bf16) config["bf16"] = {{"enabled", true}};
  if (std::string(c.optimizer) == "SGD")
    config["optimizer"] = {{"type", "SGD"}, {"params", {{"lr", 0.05}, {"momentum", 0.9}}}};
  return config;
}

// Rank `comm`'s engine under `config` over a one-layer test GPT (block 16, seed 1): what the tag
// and fault tests save.
std::shared_ptr<deepspeed::ModelEngine<gpt::GPTImpl>> small_gpt_engine(
    const nlohmann::json& config, deepspeed::comm::CommunicatorPtr comm) {
  return dstest::make_rank_engine({.config_json = config, .comm = std::move(comm)},
                                  gpt::GPTConfig{256, 16, 1, 2, 16}, /*seed=*/1)
      .engine;
}
}  // namespace

class ExactResume : public ::testing::TestWithParam<Case> {};

TEST_P(ExactResume, StepsAfterTheCheckpointAreBitIdentical) {
  const Case c = GetParam();
  dstest::TempDir dir;
  CheckpointJob full;
  full.world_size = c.world;
  full.config = config_for(c);
  full.steps = 20;
  full.save_dir = dir.path();
  full.save_at = {10};
  auto uninterrupted = run_checkpoint_job(full);
  ASSERT_EQ(uninterrupted.losses.size(), 20u);

  CheckpointJob resumed = full;
  resumed.save_at = {};
  resumed.load_dir = dir.path();
  resumed.model_seed = 4242;  // different initial weights: the checkpoint must replace them
  auto second = run_checkpoint_job(resumed);
  EXPECT_EQ(second.start_step, 10);
  EXPECT_EQ(second.load_path, dir / "global_step10/mp_rank_00_model_states.safetensors");
  EXPECT_EQ(second.client_state, (nlohmann::json{{"step", 10}, {"note", "client"}}));
  ASSERT_EQ(second.losses.size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(second.steps[i], static_cast<int64_t>(11 + i));
    EXPECT_EQ(second.losses[i], uninterrupted.losses[10 + i]) << "step " << 11 + i;  // bit for bit
  }
  ASSERT_EQ(second.weights.size(), uninterrupted.weights.size());
  for (size_t i = 0; i < second.weights.size(); ++i)
    EXPECT_TRUE(torch::equal(second.weights[i], uninterrupted.weights[i])) << "parameter " << i;
}

INSTANTIATE_TEST_SUITE_P(
    Checkpoint, ExactResume,
    ::testing::Values(Case{1, 0, "AdamW"}, Case{2, 0, "AdamW"}, Case{2, 1, "AdamW"},
                      Case{3, 2, "AdamW"}, Case{2, 0, "SGD"}, Case{2, 2, "SGD"},
                      Case{2, 0, "AdamW", true}, Case{2, 1, "AdamW", true}, Case{3, 2, "AdamW", true},
                      Case{2, 3, "AdamW"}, Case{3, 3, "AdamW", true}),
    [](const auto& info) {
      return "world" + std::to_string(info.param.world) + "_stage" +
             std::to_string(info.param.stage) + "_" + info.param.optimizer +
             (info.param.bf16 ? "_bf16" : "");
    });

// checkpoint.tag_validation "Fail": ranks saving under different tags all throw before writing.
TEST(CheckpointTag, DifferentTagsAcrossRanksFail) {
  dstest::TempDir dir;
  auto config = dstest::base_config(2, 1, 1);
  config["checkpoint"] = {{"tag_validation", "Fail"}};
  std::atomic<int> threw{0};
  dstest::run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto engine = small_gpt_engine(config, comm);
    try {
      engine->save_checkpoint(dir / "ck", "tag" + std::to_string(comm->rank()));
    } catch (const deepspeed::CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("different tags"), std::string::npos) << e.what();
      ++threw;
    }
  });
  EXPECT_EQ(threw.load(), 2);
  EXPECT_FALSE(std::filesystem::exists(dir / "ck"));
}

namespace {
// Two ranks save under different tags ("tag0", "tag1") with checkpoint.tag_validation `mode`
// (absent: the default); returns what was printed to standard error meanwhile, and each rank's
// error ("" if its save returned).
std::string save_under_different_tags(const std::string& dir, const char* mode,
                                      std::vector<std::string>& errors) {
  auto config = dstest::base_config(2, 1, 1);
  if (mode) config["checkpoint"] = {{"tag_validation", mode}};
  errors.assign(2, "");
  ::testing::internal::CaptureStderr();
  dstest::run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto engine = small_gpt_engine(config, comm);
    try {
      engine->save_checkpoint(dir, "tag" + std::to_string(comm->rank()));
    } catch (const deepspeed::CheckpointError& e) {
      errors[comm->rank()] = e.what();
    }
  });
  return ::testing::internal::GetCapturedStderr();
}

// After a save whose ranks were given "tag0" and "tag1" (Warn or Ignore): one checkpoint, under
// rank 0's tag, that both ranks load (before, rank 1 wrote into a tag1 folder nobody created and
// every rank's save failed).
void expect_one_loadable_checkpoint_under_rank_zeros_tag(const std::filesystem::path& ck) {
  EXPECT_TRUE(std::filesystem::exists(ck / "tag0"));
  EXPECT_FALSE(std::filesystem::exists(ck / "tag1"));
  std::atomic<int> loaded{0};
  dstest::run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto engine = small_gpt_engine(dstest::base_config(2, 1, 1), comm);
    if (engine->load_checkpoint(ck.string()).load_path.find("tag0") != std::string::npos) ++loaded;
  });
  EXPECT_EQ(loaded.load(), 2);
}

}  // namespace

// The default, "Warn" (DeepSpeed's too): the tag check does not refuse the save, rank 0 alone
// prints the warning, naming its tag and the setting, and every rank saves under rank 0's tag
// (DeepSpeed lets each rank write its own tag's folder: two partial checkpoints).
TEST(CheckpointTag, DifferentTagsAcrossRanksWarnByDefault) {
  dstest::TempDir dir;
  std::vector<std::string> errors;
  const std::string err = save_under_different_tags(dir / "ck", nullptr, errors);
  for (const auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(dstest::occurrences(err, "different tags"), 1u) << err;
  EXPECT_CONTAINS(err,
                  "[deepspeed] WARNING: save_checkpoint: the ranks were given different tags "
                  "(rank 0: \"tag0\"); checkpoint.tag_validation is Warn: every rank saves "
                  "under rank 0's tag");
  expect_one_loadable_checkpoint_under_rank_zeros_tag(dir / "ck");
}

// "Ignore": no refusal and nothing printed; the save is rank 0's tag's, as under Warn.
TEST(CheckpointTag, DifferentTagsAcrossRanksIgnoredSilently) {
  dstest::TempDir dir;
  std::vector<std::string> errors;
  const std::string err = save_under_different_tags(dir / "ck", "Ignore", errors);
  for (const auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(err.find("different tags"), std::string::npos) << err;
  EXPECT_EQ(err.find("tag_validation"), std::string::npos) << err;
  expect_one_loadable_checkpoint_under_rank_zeros_tag(dir / "ck");
}

// A client_state that cannot be stored on one rank only (not UTF-8): at stage 3 every rank takes
// part in the module file's gathers, so that rank must not stop alone; every rank refuses in the
// save's first phase, and nothing is written. Every parameter partitioned (threshold 0: the
// default, 1e5, would keep the whole test GPT whole and its module file would gather nothing);
// a good save afterwards shows the module file's gathers happen (all-gathers counted by the
// communicator, none before it).
TEST(CheckpointFaults, AClientStateOneRankCannotStoreFailsEveryRankBeforeWriting) {
  dstest::TempDir dir;
  std::vector<std::string> errors(2);
  std::vector<int64_t> gathers_before(2, -1), gathers_by_save(2, -1);
  auto config = dstest::base_config(2, 1, 3);
  config["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
  dstest::run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto engine = small_gpt_engine(config, comm);
    auto all_gathers = [&] {
      const auto stats = engine->communicator()->stats();
      const auto it = stats.find("all_gather");
      return it == stats.end() ? int64_t{0} : it->second.calls;
    };
    const nlohmann::json client = {{"note", comm->rank() == 1 ? "caf\xe9" : "cafe"}};
    const int64_t before = all_gathers();
    try {
      engine->save_checkpoint(dir / "ck", "bad", client);
    } catch (const deepspeed::CheckpointError& e) {
      errors[comm->rank()] = e.what();
    }
    gathers_before[comm->rank()] = all_gathers() - before;
    const int64_t good = all_gathers();
    engine->save_checkpoint(dir / "ck", "good", {{"note", "cafe"}});
    gathers_by_save[comm->rank()] = all_gathers() - good;
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(gathers_before[r], 0) << "rank " << r << ": the refused save gathered";
    EXPECT_GT(gathers_by_save[r], 0) << "rank " << r << ": the module file gathered nothing";
  }
  EXPECT_NE(errors[0].find("another rank"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("client_state at JSON pointer \"/note\""), std::string::npos)
      << errors[1];
  EXPECT_FALSE(std::filesystem::exists(dir / "ck/bad"));
}

namespace {

using EngineOnRank = std::function<void(deepspeed::Engine&, int rank)>;

// Two ranks of ZeRO-2 on the test GPT: each saves `first`, then `second` through a file system
// whose first write fails (ENOSPC) on rank 1 only, then runs `then`. Returns what each rank's
// second save threw.
std::vector<std::string> save_with_a_full_disk_on_rank_one(const std::string& dir,
                                                           const std::string& first,
                                                           const std::string& second,
                                                           const EngineOnRank& then = {}) {
  namespace ckpt = deepspeed::checkpoint;
  std::vector<std::string> errors(2);
  dstest::run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto engine = small_gpt_engine(dstest::base_config(2, 1, 2), comm);
    engine->save_checkpoint(dir, first);
    ckpt::FaultInjectingFileSystem fs(ckpt::posix_file_system());
    if (comm->rank() == 1) fs.fail_at(ckpt::FsOp::kWrite, 1, ENOSPC);
    try {
      ckpt::save_engine_checkpoint(deepspeed::state_of(*engine), fs, dir, {.tag = second});
    } catch (const deepspeed::CheckpointError& e) {
      errors[comm->rank()] = e.what();
    }
    if (then) then(*engine, comm->rank());
  });
  return errors;
}

}  // namespace

// A full disk on one rank only: every rank throws (no rank waits forever in a later collective),
// the failing rank names the errno, nothing is published and `latest` keeps naming the last
// complete checkpoint.
TEST(CheckpointFaults, OneRankDiskFullFailsEveryRank) {
  namespace ckpt = deepspeed::checkpoint;
  dstest::TempDir dir;
  const auto errors = save_with_a_full_disk_on_rank_one(dir.path(), "good", "bad");
  EXPECT_NE(errors[0].find("another rank"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("No space left on device"), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find("zero_pp_rank_1_mp_rank_00_optim_states"), std::string::npos) << errors[1];
  EXPECT_EQ(ckpt::read_latest_tag(ckpt::posix_file_system(), dir.path()), "good");
  EXPECT_FALSE(std::filesystem::exists(dir / "bad/manifest.json"));
}

// Saving again under a tag whose re-save fails on one rank keeps the tag's previous checkpoint
// (every rank wrote into the tag's replacement folder, which is never swapped in); before, the
// re-save removed the tag's manifest first and `latest` named a tag refused as incomplete.
TEST(CheckpointFaults, OneRankDiskFullDuringAReSaveKeepsTheTag) {
  namespace ckpt = deepspeed::checkpoint;
  dstest::TempDir dir;
  const auto errors = save_with_a_full_disk_on_rank_one(
      dir.path(), "best", "best", [&](deepspeed::Engine& engine, int rank) {
        EXPECT_NO_THROW(engine.load_checkpoint(dir.path())) << "rank " << rank;
        engine.save_checkpoint(dir.path(), "best");  // the next re-save completes
        EXPECT_NO_THROW(engine.load_checkpoint(dir.path())) << "rank " << rank;
      });
  EXPECT_NE(errors[1].find("No space left on device"), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find("best.replacing"), std::string::npos) << errors[1];
  EXPECT_EQ(ckpt::read_latest_tag(ckpt::posix_file_system(), dir.path()), "best");
  EXPECT_FALSE(std::filesystem::exists(dir / "best.replacing"));
  EXPECT_FALSE(std::filesystem::exists(dir / "best.replaced"));
}

}  // namespace checkpoint_resume_test
