// Engine checkpoints on one rank: the folder layout and manifest, refusal of damaged or mismatched
// checkpoints (naming the file, changing nothing), a full disk, and a save "killed" at every file
// operation (FaultInjectingFileSystem), with and without a power cut afterwards. Multi-rank
// behaviour: tests/dist/checkpoint_*_test.cpp; real SIGKILLs: checkpoint_kill_test.cpp.
#include <gtest/gtest.h>

#include <cerrno>
#include <map>
#include <filesystem>

#include "checkpoint/consolidate.h"
#include "checkpoint/fault_injecting_file_system.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "checkpoint/tag_reader.h"
#include "deepspeed/errors.h"
#include "runtime/engine_checkpoint.h"
#include "support/checkpoint_run.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/training_run.h"

namespace checkpoint_engine_test {

namespace ckpt = deepspeed::checkpoint;
namespace fs = std::filesystem;
using dstest::make_single_engine;
using dstest::SingleEngine;

namespace {
nlohmann::json config(int stage = 1) { return dstest::base_config(2, 1, stage); }

using dstest::bit_identical;

std::string latest(const std::string& dir) { return ckpt::read_latest_tag(ckpt::posix_file_system(), dir); }

// A fresh engine loads `tag` (default latest) of dir; returns its step count and weights.
const gpt::GPTConfig kSmall{256, 8, 1, 2, 16};

std::pair<int64_t, std::vector<torch::Tensor>> load_fresh(const std::string& dir, const std::string& tag = "",
                                                          const gpt::GPTConfig& model = kSmall) {
  auto e = make_single_engine(config(), model, 555);
  e.engine->load_checkpoint(dir, tag);
  return {e.engine->global_steps(), e.weights()};
}

std::string message_of(const std::function<void()>& f) {
  return dstest::message_of<deepspeed::CheckpointError>(f);
}
}  // namespace

TEST(CheckpointLayout, FilesManifestAndLatest) {
  dstest::TempDir dir;
  auto e = make_single_engine(config(2));
  e.train(2);
  EXPECT_TRUE(e.engine->save_checkpoint(dir.path(), "", {{"epoch", 3}}));
  EXPECT_EQ(latest(dir.path()), "global_step2");
  std::set<std::string> names;
  for (auto& entry : fs::directory_iterator(dir / "global_step2")) names.insert(entry.path().filename());
  EXPECT_EQ(names, (std::set<std::string>{"manifest.json", "mp_rank_00_model_states.safetensors",
                                          "zero_pp_rank_0_mp_rank_00_optim_states.safetensors"}));
  auto m = ckpt::read_manifest(ckpt::posix_file_system(), dir / "global_step2");
  EXPECT_EQ(m.files.size(), 2u);
  EXPECT_EQ(m.metadata["world_size"], 1);
  EXPECT_EQ(m.metadata["zero_stage"], 2);
  EXPECT_EQ(m.metadata["precision"], "fp32");
  EXPECT_EQ(m.metadata["library_version"], ckpt::library_version());
  EXPECT_EQ(m.metadata["optimizer"]["format"], "adam_fragments");
  EXPECT_EQ(m.metadata["optimizer"]["adam_step"], 2);
  const auto& model_tensors = m.metadata["tensors"]["mp_rank_00_model_states.safetensors"];
  EXPECT_EQ(model_tensors["wte.weight"]["dtype"], "F32") << model_tensors.dump();
  EXPECT_EQ(model_tensors["wte.weight"]["shape"], (nlohmann::json{256, 32}));
  EXPECT_EQ(m.metadata["tensors"]["zero_pp_rank_0_mp_rank_00_optim_states.safetensors"]
                     ["exp_avg/wte.weight"]["shape"], (nlohmann::json{256 * 32}));
  // Every byte of both files is covered by the manifest's checksums.
  EXPECT_NO_THROW(ckpt::verify_files(dir / "global_step2", m));

  auto fresh = make_single_engine(config(2), {256, 16, 2, 2, 32}, 99);
  auto loaded = fresh.engine->load_checkpoint(dir.path());
  EXPECT_EQ(loaded.load_path, dir / "global_step2/mp_rank_00_model_states.safetensors");
  EXPECT_EQ(loaded.client_state, (nlohmann::json{{"epoch", 3}}));
  EXPECT_EQ(fresh.engine->global_steps(), 2);
  EXPECT_TRUE(bit_identical(fresh.weights(), e.weights()));
}

TEST(CheckpointLayout, NoLatestLoadsNothing) {
  dstest::TempDir dir;
  auto e = make_single_engine(config());
  auto before = e.weights();
  auto loaded = e.engine->load_checkpoint(dir.path());
  EXPECT_TRUE(loaded.load_path.empty());
  EXPECT_TRUE(loaded.client_state.is_null());
  EXPECT_TRUE(bit_identical(e.weights(), before));
}

TEST(CheckpointLayout, ExplicitTagWithoutLatestAndModuleOnly) {
  dstest::TempDir dir;
  auto e = make_single_engine(config(1));
  e.train(3);
  e.engine->save_checkpoint(dir.path(), "mine", nlohmann::json::object(), /*save_latest=*/false);
  EXPECT_FALSE(fs::exists(dir / "latest"));
  auto fresh = make_single_engine(config(1), {256, 16, 2, 2, 32}, 99);
  fresh.engine->load_checkpoint(dir.path(), "mine", true, true, true, /*load_module_only=*/true);
  EXPECT_TRUE(bit_identical(fresh.weights(), e.weights()));
  EXPECT_EQ(fresh.engine->global_steps(), 0);  // module only: counters untouched
  fresh.train(1);                              // and the masters were refreshed from the module
  EXPECT_FALSE(bit_identical(fresh.weights(), e.weights()));
}

// Frozen parameters have no optimizer state: they travel in the model-states file only, and the
// fragments of the trainable ones still line up (stage 2 partitions skip the frozen tensor).
TEST(CheckpointLayout, FrozenParametersRoundTrip) {
  dstest::TempDir dir;
  const std::vector<std::string> frozen = {"wpe.weight"};
  auto e = make_single_engine(config(2), kSmall, 7, frozen);
  e.train(2);
  e.engine->save_checkpoint(dir.path());
  auto m = ckpt::read_manifest(ckpt::posix_file_system(), dir / "global_step2");
  for (auto& t : m.metadata["trainable"]) EXPECT_NE(t["name"], "wpe.weight");
  auto fresh = make_single_engine(config(2), kSmall, 8, frozen);
  fresh.engine->load_checkpoint(dir.path());
  EXPECT_TRUE(bit_identical(fresh.weights(), e.weights()));
  // Loading into a model where it is trainable: no optimizer state for it, refused by name,
  // saying how to load it.
  auto unfrozen = make_single_engine(config(2), kSmall, 8);
  auto msg = message_of([&] { unfrozen.engine->load_checkpoint(dir.path()); });
  EXPECT_CONTAINS(msg, "wpe.weight");
  EXPECT_CONTAINS(msg, "load_optimizer_states=false");
  EXPECT_NO_THROW(unfrozen.engine->load_checkpoint(dir.path(), "", true, true, true, /*load_module_only=*/true));
  EXPECT_TRUE(bit_identical(unfrozen.weights(), e.weights()));
  // Without the optimizer states its master is taken from the loaded weights (DeepSpeed rebuilds
  // every master so), and the others' from the checkpoint.
  auto rebuilt = make_single_engine(config(2), kSmall, 8);
  EXPECT_NO_THROW(
      rebuilt.engine->load_checkpoint(dir.path(), "", true, /*load_optimizer_states=*/false));
  EXPECT_TRUE(bit_identical(rebuilt.weights(), e.weights()));
}

// The same in bf16, where the masters are not the module's weights: a master left as it was
// (the fresh model's) would replace the loaded weight when the load ends. With
// load_module_strict=false the optimizer states of the others load too.
TEST(CheckpointLayout, UnfrozenParameterTakesItsMasterFromTheLoadedWeights) {
  dstest::TempDir dir;
  auto cfg = config(2);
  cfg["bf16"] = {{"enabled", true}};
  auto e = make_single_engine(cfg, kSmall, 7, {"wpe.weight"});
  e.train(2);
  e.engine->save_checkpoint(dir.path());
  for (bool strict : {true, false}) {
    SCOPED_TRACE(strict ? "load_optimizer_states=false" : "load_module_strict=false");
    auto unfrozen = make_single_engine(cfg, kSmall, 8);
    EXPECT_NO_THROW(unfrozen.engine->load_checkpoint(dir.path(), "", strict,
                                                     /*load_optimizer_states=*/!strict));
    EXPECT_TRUE(bit_identical(unfrozen.weights(), e.weights()));
    EXPECT_EQ(unfrozen.engine->global_steps(), 2);
    unfrozen.train(1);  // the masters of every parameter are there to step
  }
}

// A trainable parameter the checkpoint lacks entirely (a new head): strict refuses it by name;
// load_module_strict=false keeps its value and loads the rest, optimizer states included.
TEST(CheckpointLayout, ExtraTrainableParameterLoadsWhenNotStrict) {
  dstest::TempDir dir;
  auto cfg = config(2);
  cfg["bf16"] = {{"enabled", true}};
  auto e = make_single_engine(cfg, kSmall, 7);
  e.train(2);
  e.engine->save_checkpoint(dir.path());

  at::set_num_threads(1);
  torch::manual_seed(8);
  auto model = std::make_shared<gpt::GPTImpl>(kSmall);
  model->register_parameter("extra", torch::full({5}, 0.25));
  auto fresh = deepspeed::initialize<gpt::GPTImpl>(
                   {.model = model, .config_json = cfg,
                    .comm = deepspeed::comm::make_single_process_communicator()})
                   .engine;
  auto msg = message_of([&] { fresh->load_checkpoint(dir.path()); });
  EXPECT_CONTAINS(msg, "\"extra\"");
  EXPECT_CONTAINS(msg, "load_module_strict=false");
  EXPECT_NO_THROW(fresh->load_checkpoint(dir.path(), "", /*load_module_strict=*/false));
  EXPECT_EQ(fresh->global_steps(), 2);
  std::vector<torch::Tensor> loaded;
  for (auto& item : model->named_parameters())
    if (item.key() != "extra") loaded.push_back(item.value().detach().clone());
  EXPECT_TRUE(bit_identical(loaded, e.weights()));
  EXPECT_TRUE(torch::equal(model->named_parameters()["extra"].to(torch::kFloat),
                           torch::full({5}, 0.25)));
}

// The CPU generator continues from where it was at the save (dropout masks, sampling...).
TEST(CheckpointLayout, RandomNumberGeneratorStateIsRestored) {
  dstest::TempDir dir;
  auto e = make_single_engine(config(), kSmall);
  e.train(1);
  e.engine->save_checkpoint(dir.path());
  const auto expected = torch::rand({8});
  auto fresh = make_single_engine(config(), kSmall, 1234);
  torch::rand({3});
  fresh.engine->load_checkpoint(dir.path());
  EXPECT_TRUE(torch::equal(torch::rand({8}), expected));
}

TEST(CheckpointRefusal, CorruptedTruncatedIncompleteOrMismatched) {
  dstest::TempDir dir;
  auto e = make_single_engine(config());
  e.train(2);
  e.engine->save_checkpoint(dir.path());
  const std::string tag = dir / "global_step2";
  const std::string optim = tag + "/zero_pp_rank_0_mp_rank_00_optim_states.safetensors";
  const std::string model = tag + "/mp_rank_00_model_states.safetensors";
  const std::string good_optim = dstest::read_bytes(optim), good_model = dstest::read_bytes(model);

  auto victim = make_single_engine(config(), {256, 16, 2, 2, 32}, 31);
  const auto untouched = victim.weights();
  auto try_load = [&] { return message_of([&] { victim.engine->load_checkpoint(dir.path()); }); };

  std::string flipped = good_optim;
  flipped[flipped.size() / 2] ^= 0x10;
  dstest::write_bytes(optim, flipped);
  auto msg = try_load();
  EXPECT_NE(msg.find(optim), std::string::npos) << msg;
  EXPECT_NE(msg.find("corrupted"), std::string::npos) << msg;
  dstest::write_bytes(optim, good_optim);

  dstest::write_bytes(model, good_model.substr(0, good_model.size() - 100));
  msg = try_load();
  EXPECT_NE(msg.find(model), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  dstest::write_bytes(model, good_model);

  fs::rename(tag + "/manifest.json", tag + "/manifest.moved");
  msg = try_load();
  EXPECT_NE(msg.find("incomplete"), std::string::npos) << msg;
  fs::rename(tag + "/manifest.moved", tag + "/manifest.json");

  dstest::write_bytes(dir / "latest", "global_step77");
  msg = try_load();
  EXPECT_NE(msg.find("global_step77"), std::string::npos) << msg;
  dstest::write_bytes(dir / "latest", "global_step2");

  // A different model: the file and the tensor at fault are named.
  auto other = make_single_engine(config(), {256, 16, 2, 2, 24}, 31);
  msg = message_of([&] { other.engine->load_checkpoint(dir.path()); });
  EXPECT_NE(msg.find(model), std::string::npos) << msg;
  EXPECT_NE(msg.find("shape"), std::string::npos) << msg;

  EXPECT_TRUE(bit_identical(victim.weights(), untouched));  // nothing was changed by the refusals
  EXPECT_NO_THROW(victim.engine->load_checkpoint(dir.path()));
  EXPECT_TRUE(bit_identical(victim.weights(), e.weights()));
}

// `latest` is read back trimmed (as DeepSpeed's strip()): a tag with whitespace at an end would
// be saved and then not found, so it is refused at the save, before anything is written.
TEST(CheckpointRefusal, ATagThatLatestCannotNameIsRefusedAtTheSave) {
  dstest::TempDir dir;
  auto e = make_single_engine(config(), kSmall);
  e.train(1);
  for (const std::string tag : {"best ", " best", "best\n", "be\tst"}) {
    auto msg = message_of([&] { e.engine->save_checkpoint(dir.path(), tag); });
    EXPECT_NE(msg.find("not a valid folder name"), std::string::npos) << msg;
  }
  EXPECT_TRUE(fs::is_empty(dir.path()));
  e.engine->save_checkpoint(dir.path(), "best run");  // inner spaces are fine
  EXPECT_EQ(load_fresh(dir.path()).first, 1);
}

// A folder of Python DeepSpeed's (torch.save pickles, no manifest) is named as such, not as an
// unfinished save of ours.
TEST(CheckpointRefusal, APythonDeepSpeedCheckpointIsNamedAsSuch) {
  dstest::TempDir dir;
  fs::create_directories(dir / "global_step1");
  dstest::write_bytes(dir / "latest", "global_step1");
  dstest::write_bytes(dir / "global_step1/mp_rank_00_model_states.pt", "PK\x03\x04");
  auto fresh = make_single_engine(config(), kSmall, 3);
  auto msg = message_of([&] { fresh.engine->load_checkpoint(dir.path()); });
  EXPECT_NE(msg.find("Python DeepSpeed"), std::string::npos) << msg;
  EXPECT_NE(msg.find("mp_rank_00_model_states.pt"), std::string::npos) << msg;
}

namespace {
// An engine (stage `stage`, one process) stepping a client torch::optim::RMSprop with momentum:
// an optimizer outside the families saved per element, so its state is libtorch's archive.
SingleEngine rmsprop_engine(int stage) {
  at::set_num_threads(1);
  auto c = config(stage);
  c.erase("optimizer");
  const gpt::GPTConfig model{256, 16, 2, 2, 32};
  SingleEngine e;
  torch::manual_seed(7);
  e.model = std::make_shared<gpt::GPTImpl>(model);
  auto r = deepspeed::initialize<gpt::GPTImpl>(
      {.model = e.model,
       .config_json = c,
       .training_data = dstest::test_text_dataset(model.block_size),
       .optimizer = std::make_shared<torch::optim::RMSprop>(
           e.model->parameters(), torch::optim::RMSpropOptions(0.01).momentum(0.9)),
       .comm = deepspeed::comm::make_single_process_communicator()});
  e.engine = r.engine;
  e.loader = r.training_dataloader;
  return e;
}
}  // namespace

TEST(CheckpointRefusal, ArchiveStateNeedsTheSameLayout) {
  dstest::TempDir dir;
  auto e = rmsprop_engine(1);
  e.train(2);
  e.engine->save_checkpoint(dir.path());
  EXPECT_EQ(ckpt::read_manifest(ckpt::posix_file_system(), dir / "global_step2")
                .metadata["optimizer"]["format"],
            "torch_archive");
  auto other_stage = rmsprop_engine(2);
  auto msg = message_of([&] { other_stage.engine->load_checkpoint(dir.path()); });
  EXPECT_NE(msg.find("holds a libtorch optimizer archive (a client optimizer's own state)"),
            std::string::npos) << msg;
  EXPECT_NE(msg.find("ZeRO stage 1"), std::string::npos) << msg;
  // Weights alone load anywhere.
  EXPECT_NO_THROW(other_stage.engine->load_checkpoint(dir.path(), "", true, /*load_optimizer_states=*/false));
  EXPECT_TRUE(bit_identical(other_stage.weights(), e.weights()));
  auto adam = make_single_engine(config(1));
  msg = message_of([&] { adam.engine->load_checkpoint(dir.path()); });
  EXPECT_NE(msg.find("holds a libtorch optimizer archive"), std::string::npos) << msg;
  EXPECT_NE(msg.find("keeps Adam moments"), std::string::npos) << msg;
  // Lion, Adagrad and SGD load their state from their fragment formats only; the message says
  // an archive of theirs is from an earlier build.
  for (const char* type : {"Lion", "Adagrad", "SGD"}) {
    auto other = config(1);
    other["optimizer"] = {{"type", type}};
    auto engine = make_single_engine(other);
    msg = message_of([&] { engine.engine->load_checkpoint(dir.path()); });
    EXPECT_NE(msg.find("holds a libtorch optimizer archive"), std::string::npos) << msg;
    EXPECT_NE(msg.find("earlier builds saved Lion's, Adagrad's and SGD's state as an archive"),
              std::string::npos) << msg;
    EXPECT_NE(msg.find("load_optimizer_states=false"), std::string::npos) << msg;
  }
}

TEST(CheckpointFaults, DiskFullFailsClearlyAndLosesNothing) {
  dstest::TempDir dir;
  auto e = make_single_engine(config(), kSmall);
  e.train(2);
  e.engine->save_checkpoint(dir.path());
  const auto at2 = e.weights();
  e.train(2);
  ckpt::FaultInjectingFileSystem counter(ckpt::posix_file_system());
  ckpt::save_engine_checkpoint(deepspeed::state_of(*e.engine), counter, dir / "probe", {});
  const int writes = counter.calls(ckpt::FsOp::kWrite);
  ASSERT_GT(writes, 3);
  for (int nth : {1, 2, writes / 2, writes}) {
    ckpt::FaultInjectingFileSystem full(ckpt::posix_file_system());
    full.fail_at(ckpt::FsOp::kWrite, nth, ENOSPC);
    auto msg = message_of([&] { ckpt::save_engine_checkpoint(deepspeed::state_of(*e.engine), full, dir.path(), {}); });
    EXPECT_NE(msg.find("No space left on device"), std::string::npos) << "write " << nth << ": " << msg;
    EXPECT_NE(msg.find(dir / "global_step4"), std::string::npos) << msg;
    EXPECT_EQ(latest(dir.path()), "global_step2");
    for (auto& entry : fs::directory_iterator(dir / "global_step4"))
      EXPECT_FALSE(ckpt::is_temp_file_name(entry.path().filename())) << entry.path();
    auto [step, weights] = load_fresh(dir.path());
    EXPECT_EQ(step, 2);
    EXPECT_TRUE(bit_identical(weights, at2));
  }
}

// The save of step 4 dies at the K-th call of each file operation (optionally followed by a
// power cut that drops unsynced data and renames). Always: `latest` names a complete checkpoint
// and loading it gives exactly its weights; step 4 is either refused or complete. Re-saving a tag
// (`resave`: "best" holds step 2, step 4 is saved as "best" again) goes through the tag's
// replacement folder: then "best" always loads, as step 2 or step 4, never refused, and the next
// save of "best" completes whatever the dead one left.
class CheckpointCrash : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(CheckpointCrash, AtEveryFileOperationThePreviousCheckpointSurvives) {
  const auto [power_cut, resave] = GetParam();
  dstest::TempDir dir;
  auto e = make_single_engine(config(), kSmall);
  e.train(2);
  const std::string old_tag = resave ? "best" : "global_step2";
  const std::string new_tag = resave ? "best" : "global_step4";
  e.engine->save_checkpoint(dir.path(), old_tag);
  fs::copy(dir / old_tag, dir / "pristine");
  const auto at2 = e.weights();
  e.train(2);
  const auto at4 = e.weights();
  ckpt::FaultInjectingFileSystem counter(ckpt::posix_file_system());
  ckpt::save_engine_checkpoint(deepspeed::state_of(*e.engine), counter, dir.path(), {.tag = new_tag});
  // A file of the user's in the re-saved tag survives whatever happens to the save.
  auto restore_step2 = [&] {
    for (const auto& name : {new_tag, new_tag + ".replacing", new_tag + ".replaced"})
      fs::remove_all(dir / name);
    fs::remove_all(dir / old_tag);
    fs::copy(dir / "pristine", dir / old_tag);
    if (resave) dstest::write_bytes(dir / (old_tag + "/notes.txt"), "kept");
    dstest::write_bytes(dir / "latest", old_tag);
  };
  int cases = 0;
  for (auto op : {ckpt::FsOp::kMakeDirs, ckpt::FsOp::kCreate, ckpt::FsOp::kWrite, ckpt::FsOp::kSync,
                  ckpt::FsOp::kClose, ckpt::FsOp::kRename, ckpt::FsOp::kSyncDir, ckpt::FsOp::kRemove}) {
    restore_step2();
    counter.reset();
    ckpt::save_engine_checkpoint(deepspeed::state_of(*e.engine), counter, dir.path(), {.tag = new_tag});
    const int calls = counter.calls(op);
    for (int nth = 1; nth <= calls; nth += std::max(1, calls / 12)) {
      const std::string where = std::string(ckpt::fs_op_name(op)) + " #" + std::to_string(nth);
      restore_step2();
      ckpt::FaultInjectingFileSystem crashing(ckpt::posix_file_system());
      crashing.crash_at(op, nth);
      EXPECT_THROW(ckpt::save_engine_checkpoint(deepspeed::state_of(*e.engine), crashing, dir.path(),
                                                {.tag = new_tag}),
                   ckpt::SimulatedCrash) << where;
      if (power_cut) crashing.simulate_power_loss();
      const std::string tag = latest(dir.path());
      ASSERT_TRUE(tag == old_tag || tag == new_tag) << where << ": latest " << tag;
      if (resave) {
        auto [step, weights] = load_fresh(dir.path());
        ASSERT_TRUE(step == 2 || step == 4) << where;
        EXPECT_TRUE(bit_identical(weights, step == 2 ? at2 : at4)) << where;
        // The next save of the tag finishes or discards what the dead one left.
        ckpt::save_engine_checkpoint(deepspeed::state_of(*e.engine), ckpt::posix_file_system(),
                                     dir.path(), {.tag = new_tag});
        EXPECT_TRUE(bit_identical(load_fresh(dir.path()).second, at4)) << where;
        EXPECT_FALSE(fs::exists(dir / "best.replacing")) << where;
        EXPECT_FALSE(fs::exists(dir / "best.replaced")) << where;
        EXPECT_TRUE(fs::exists(dir / "best/notes.txt")) << where;
        ++cases;
        continue;
      }
      auto [step, weights] = load_fresh(dir.path());
      EXPECT_EQ("global_step" + std::to_string(step), tag) << where;
      EXPECT_TRUE(bit_identical(weights, tag == "global_step2" ? at2 : at4)) << where;
      try {
        auto [s4, w4] = load_fresh(dir.path(), "global_step4");
        EXPECT_TRUE(bit_identical(w4, at4)) << where;
      } catch (const deepspeed::CheckpointError&) {
        EXPECT_EQ(tag, "global_step2") << where << ": latest names a tag that does not load";
      }
      ++cases;
    }
  }
  EXPECT_GT(cases, 20);
}

INSTANTIATE_TEST_SUITE_P(Checkpoint, CheckpointCrash,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "ThenPowerCut" : "ProcessKilled") +
                                  (std::get<1>(info.param) ? "ReSavingATag" : "");
                         });

// Saving a tag again that fails (a full disk) leaves the tag's previous checkpoint loadable; before,
// the re-save removed its manifest first and then wrote over its files, so `latest` named a tag
// that was refused as incomplete.
TEST(CheckpointFaults, AFailedReSaveOfATagKeepsItsPreviousCheckpoint) {
  dstest::TempDir dir;
  auto e = make_single_engine(config(), kSmall);
  e.train(2);
  e.engine->save_checkpoint(dir.path(), "best");
  const auto at2 = e.weights();
  e.train(2);
  ckpt::FaultInjectingFileSystem counter(ckpt::posix_file_system());
  ckpt::save_engine_checkpoint(deepspeed::state_of(*e.engine), counter, dir / "probe", {});
  const int writes = counter.calls(ckpt::FsOp::kWrite);
  // The last write is `latest`'s, after the swap: the new save is then complete under the tag.
  for (int nth : {1, writes / 2, writes - 1, writes}) {
    ckpt::FaultInjectingFileSystem full(ckpt::posix_file_system());
    full.fail_at(ckpt::FsOp::kWrite, nth, ENOSPC);
    auto msg = message_of([&] {
      ckpt::save_engine_checkpoint(deepspeed::state_of(*e.engine), full, dir.path(), {.tag = "best"});
    });
    EXPECT_NE(msg.find("No space left on device"), std::string::npos) << "write " << nth << ": " << msg;
    EXPECT_EQ(latest(dir.path()), "best");
    auto [step, weights] = load_fresh(dir.path());
    const bool swapped = nth == writes;
    EXPECT_EQ(step, swapped ? 4 : 2) << "write " << nth;
    EXPECT_TRUE(bit_identical(weights, swapped ? e.weights() : at2)) << "write " << nth;
    if (swapped) EXPECT_NE(msg.find("is complete, but 'latest' was not updated"), std::string::npos) << msg;
  }
  e.engine->save_checkpoint(dir.path(), "best");
  EXPECT_TRUE(bit_identical(load_fresh(dir.path()).second, e.weights()));
  EXPECT_FALSE(fs::exists(dir / "best.replacing"));
  EXPECT_FALSE(fs::exists(dir / "best.replaced"));
}

TEST(CheckpointLayout, PartitionFragmentsCoverEveryParameterOnce) {
  std::vector<int64_t> numels = {7, 1, 130, 33, 0, 64};
  for (int world = 1; world <= 5; ++world) {
    std::vector<std::vector<int>> seen(numels.size());
    for (size_t k = 0; k < numels.size(); ++k) seen[k].assign(numels[k], 0);
    for (int r = 0; r < world; ++r)
      for (auto& f : ckpt::partition_fragments(numels, world, r))
        for (int64_t i = 0; i < f.numel; ++i) ++seen[f.param][f.offset + i];
    for (size_t k = 0; k < numels.size(); ++k)
      for (int c : seen[k]) EXPECT_EQ(c, 1) << "world " << world << " param " << k;
  }
}

namespace {
struct TwoBiasedLayersImpl : torch::nn::Module {
  torch::nn::Linear a{nullptr}, b{nullptr};
  TwoBiasedLayersImpl() {
    a = register_module("a", torch::nn::Linear(8, 8));
    b = register_module("b", torch::nn::Linear(8, 8));
  }
  torch::Tensor forward(torch::Tensor x) { return b(a(x)).pow(2).mean(); }
};
}  // namespace

namespace {
// A parameter of no elements among trained ones (a zero-width layer, an empty bias): it is in
// the manifest's trainable list but no rank holds a fragment of it.
struct WithEmptyParameterImpl : torch::nn::Module {
  torch::nn::Linear a{nullptr};
  torch::Tensor empty;
  WithEmptyParameterImpl() {
    a = register_module("a", torch::nn::Linear(8, 8));
    empty = register_parameter("empty", torch::zeros({0}));
  }
  torch::Tensor forward(torch::Tensor x) { return a(x).pow(2).mean() + empty.sum(); }
};

std::shared_ptr<deepspeed::ModelEngine<WithEmptyParameterImpl>> with_empty_parameter(
    int stage, uint64_t seed, std::shared_ptr<WithEmptyParameterImpl>* model_out) {
  at::set_num_threads(1);
  torch::manual_seed(seed);
  auto model = std::make_shared<WithEmptyParameterImpl>();
  if (model_out) *model_out = model;
  return deepspeed::initialize<WithEmptyParameterImpl>(
             {.model = model, .config_json = config(stage),
              .comm = deepspeed::comm::make_single_process_communicator()})
      .engine;
}
}  // namespace

// Saved, resumed and exported (ds_to_fp32's consolidation) with a zero-element trainable
// parameter, at every stage, as DeepSpeed's zero_to_fp32 exports it: "empty" comes back with sizes {0}, the
// others equal to the trained weights.
TEST(CheckpointLayout, AZeroElementParameterSavesResumesAndExports) {
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    dstest::TempDir dir;
    std::shared_ptr<WithEmptyParameterImpl> model;
    auto engine = with_empty_parameter(stage, 1, &model);
    torch::manual_seed(5);
    for (int i = 0; i < 2; ++i) {
      engine->backward(engine->forward(torch::randn({2, 8})));
      engine->step();
    }
    ASSERT_NO_THROW(engine->save_checkpoint(dir.path()));

    std::shared_ptr<WithEmptyParameterImpl> fresh_model;
    auto fresh = with_empty_parameter(stage, 2, &fresh_model);
    ASSERT_NO_THROW(fresh->load_checkpoint(dir.path()));
    EXPECT_TRUE(torch::equal(fresh_model->a->weight, model->a->weight));
    EXPECT_NO_THROW(fresh->backward(fresh->forward(torch::randn({2, 8}))));
    EXPECT_NO_THROW(fresh->step());

    auto& fs = ckpt::posix_file_system();
    ckpt::NamedTensors exported;
    ASSERT_NO_THROW(exported = ckpt::consolidate_fp32(fs, ckpt::resolve_tag_dir(fs, dir.path())));
    std::map<std::string, torch::Tensor> by_name(exported.begin(), exported.end());
    ASSERT_EQ(by_name.count("empty"), 1u);
    EXPECT_EQ(by_name["empty"].sizes(), (std::vector<int64_t>{0}));
    for (auto& item : model->named_parameters()) {
      ASSERT_EQ(by_name.count(item.key()), 1u) << item.key();
      EXPECT_TRUE(torch::equal(by_name[item.key()], item.value().to(torch::kFloat))) << item.key();
    }
  }
}

// A libtorch optimizer's archive (stage 0 fp32, client AdamW) saved with one parameter group
// and loaded into an optimizer grouped in two (weight decay, and none for the biases): named
// before anything is loaded, with the way out; the model keeps its weights.
TEST(CheckpointLayout, AClientOptimizerGroupedDifferentlyIsNamedBeforeLoading) {
  dstest::TempDir dir;
  auto build = [](bool two_groups, uint64_t seed) {
    torch::manual_seed(seed);
    auto model = std::make_shared<TwoBiasedLayersImpl>();
    std::vector<torch::optim::OptimizerParamGroup> groups;
    if (two_groups) {
      std::vector<at::Tensor> weights, biases;
      for (const auto& item : model->named_parameters())
        (item.key().find("bias") != std::string::npos ? biases : weights).push_back(item.value());
      groups.emplace_back(weights, std::make_unique<torch::optim::AdamWOptions>(1e-3));
      auto none = std::make_unique<torch::optim::AdamWOptions>(1e-3);
      none->weight_decay(0);
      groups.emplace_back(biases, std::move(none));
    } else {
      groups.emplace_back(model->parameters(), std::make_unique<torch::optim::AdamWOptions>(1e-3));
    }
    auto optimizer = std::make_shared<torch::optim::AdamW>(std::move(groups));
    nlohmann::json config = {{"train_micro_batch_size_per_gpu", 2}};
    auto engine = deepspeed::initialize<TwoBiasedLayersImpl>(
                      {.model = model, .config_json = config, .optimizer = optimizer})
                      .engine;
    engine->backward(engine->forward(torch::randn({2, 8})));
    engine->step();
    return std::make_pair(model, engine);
  };
  auto [saved_model, saved] = build(false, 1);
  saved->save_checkpoint(dir.path());
  auto [model, grouped] = build(true, 2);
  const at::Tensor before = model->a->weight.clone();
  const auto msg = message_of([&] { grouped->load_checkpoint(dir.path()); });
  EXPECT_CONTAINS(msg, dir.path());
  EXPECT_CONTAINS(msg, "saved with 1 parameter group(s) of 4 tensors");
  EXPECT_CONTAINS(msg, "now has 2 parameter group(s) of 2, 2 tensors");
  EXPECT_CONTAINS(msg, "load_optimizer_states=false");
  EXPECT_TRUE(torch::equal(model->a->weight, before)) << "nothing loaded";
  EXPECT_NO_THROW(grouped->load_checkpoint(dir.path(), "", true, /*load_optimizer_states=*/false));
  EXPECT_TRUE(torch::equal(model->a->weight, saved_model->a->weight));
}

}  // namespace checkpoint_engine_test
