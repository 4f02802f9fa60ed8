// The checkpoint API's edges on one rank: what client_state can hold (inf, -inf and NaN come
// back; what JSON cannot hold, or the header cannot, is refused at the save before anything is
// written), a scheduler state that cannot load refused before anything changes, load_module_only
// in the middle of an accumulation, `latest` read as DeepSpeed strips it, and the checkpoint keys
// parsed but not used. Layout and refusals of damaged files: checkpoint_engine_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "checkpoint/tag_reader.h"
#include "deepspeed/config.h"
#include "deepspeed/errors.h"
#include "deepspeed/lr_scheduler.h"
#include "support/checkpoint_run.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/training_run.h"

namespace checkpoint_api_test {

namespace ckpt = deepspeed::checkpoint;
namespace fs = std::filesystem;
using dstest::bit_identical;
using dstest::make_single_engine;
using json = nlohmann::json;

namespace {
json config(int accumulation = 1) { return dstest::base_config(2, accumulation, 1); }

std::string message_of(const std::function<void()>& f) {
  return dstest::message_of<deepspeed::CheckpointError>(f);
}

std::string latest(const std::string& dir) {
  return ckpt::read_latest_tag(ckpt::posix_file_system(), dir);
}

// A client scheduler that keeps its own state, {"step": n}, as a user's may.
class StepCounter : public deepspeed::LRScheduler {
 public:
  std::string name() const override { return "StepCounter"; }
  void step() override { ++steps_; }
  std::vector<double> get_lr() const override { return {3e-3}; }
  std::vector<double> get_mom() const override { return {}; }
  int64_t last_batch_iteration() const override { return steps_ - 1; }
  json state_dict() const override { return {{"step", steps_}}; }
  void load_state_dict(const json& state) override { steps_ = state.at("step").get<int64_t>(); }

 private:
  int64_t steps_ = 0;
};
}  // namespace

// JSON has no inf or NaN (nlohmann writes null): they are stored in a reserved form and come back
// as numbers, wherever they are; {"best_loss": inf} is common, and DeepSpeed's pickle keeps it.
TEST(CheckpointClientState, InfinitiesAndNaNComeBack) {
  dstest::TempDir dir;
  auto e = make_single_engine(config());
  e.train(1);
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  json client = {{"best_loss", inf}, {"plain", 1.5}, {"name", "run"}};
  client["history"] = {2.5, -inf, nan, {{"worst", -inf}}};
  client["nested"]["a"]["b"] = {nan, inf};
  e.engine->save_checkpoint(dir.path(), "", client);
  auto fresh = make_single_engine(config(), {256, 16, 2, 2, 32}, 9);
  const json got = fresh.engine->load_checkpoint(dir.path()).client_state;
  auto number = [&](const std::string& pointer) {
    const json& v = got.at(json::json_pointer(pointer));
    EXPECT_TRUE(v.is_number_float()) << pointer << " came back as " << v.dump();
    return v.is_number_float() ? v.get<double>() : 0.0;
  };
  EXPECT_EQ(number("/best_loss"), inf);
  EXPECT_EQ(number("/plain"), 1.5);
  EXPECT_EQ(number("/history/0"), 2.5);
  EXPECT_EQ(number("/history/1"), -inf);
  EXPECT_TRUE(std::isnan(number("/history/2")));
  EXPECT_EQ(number("/history/3/worst"), -inf);
  EXPECT_TRUE(std::isnan(number("/nested/a/b/0")));
  EXPECT_EQ(number("/nested/a/b/1"), inf);
  EXPECT_EQ(got.at("name"), "run");
  EXPECT_EQ(got.size(), client.size());
}

// What cannot be stored is refused at the save, naming where it is, before anything is written:
// a string that is not UTF-8 (JSON cannot hold it), an object using the reserved key.
TEST(CheckpointClientState, WhatCannotBeStoredIsNamedBeforeAnythingIsWritten) {
  dstest::TempDir dir;
  auto e = make_single_engine(config());
  e.train(1);
  e.engine->save_checkpoint(dir.path(), "good");
  json bytes;
  bytes["runs"][1]["name"] = std::string("caf\xe9");  // Latin-1
  std::string msg = message_of([&] { e.engine->save_checkpoint(dir.path(), "bad", bytes); });
  EXPECT_CONTAINS(msg, "client_state at JSON pointer \"/runs/1/name\"");
  EXPECT_CONTAINS(msg, "not valid UTF-8");
  json key;
  key["ok"][std::string("k\xff")] = 1;
  msg = message_of([&] { e.engine->save_checkpoint(dir.path(), "bad", key); });
  EXPECT_CONTAINS(msg, "client_state at JSON pointer \"/ok\" has a key that is not valid UTF-8");
  json reserved;
  reserved["a/b"]["__ds_non_finite__"] = "inf";
  msg = message_of([&] { e.engine->save_checkpoint(dir.path(), "bad", reserved); });
  EXPECT_CONTAINS(msg, "client_state at JSON pointer \"/a~1b\" has the key \"__ds_non_finite__\"");
  EXPECT_FALSE(fs::exists(dir / "bad"));
  EXPECT_EQ(latest(dir.path()), "good");
}

// The model-states file's header holds the client_state: past the readers' 100 MiB limit the
// file could be written but never read, so the save refuses it, naming the size and the limit.
TEST(CheckpointClientState, OneOverTheHeaderLimitIsRefusedAtTheSave) {
  dstest::TempDir dir;
  auto e = make_single_engine(config());
  const json huge = {{"blob", std::string(size_t(101) << 20, 'x')}};
  const std::string msg = message_of([&] { e.engine->save_checkpoint(dir.path(), "huge", huge); });
  EXPECT_CONTAINS(msg, "mp_rank_00_model_states.safetensors");
  EXPECT_CONTAINS(msg, "its header would be 1059");  // 101 MiB and the rest of the metadata
  EXPECT_CONTAINS(msg, "over the 104857600-byte (100 MiB) limit");
  EXPECT_FALSE(fs::exists(dir / "latest"));
  EXPECT_FALSE(fs::exists(dir / "huge/manifest.json"));
}

// A saved scheduler state the engine's scheduler cannot take (a client scheduler's own state, or
// a step past the new schedule's end) is refused while the checkpoint is checked: nothing of the
// engine changed, and the error names the key and the way out.
TEST(CheckpointScheduler, AStateThatCannotLoadIsRefusedBeforeAnythingChanges) {
  dstest::TempDir dir;
  torch::manual_seed(7);
  auto model = std::make_shared<gpt::GPTImpl>(gpt::GPTConfig{256, 16, 2, 2, 32});
  auto r = deepspeed::initialize<gpt::GPTImpl>(
      {.model = model,
       .config_json = config(),
       .training_data = dstest::test_text_dataset(16),
       .lr_scheduler = [](std::shared_ptr<torch::optim::Optimizer>)
           -> std::shared_ptr<deepspeed::LRScheduler> { return std::make_shared<StepCounter>(); },
       .comm = deepspeed::comm::make_single_process_communicator()});
  dstest::SingleEngine client{model, r.engine, r.training_dataloader};
  client.train(3);
  client.engine->save_checkpoint(dir.path(), "client");
  json with_warmup = config();
  with_warmup["scheduler"] = {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 10}}}};
  json with_cosine = config();
  with_cosine["scheduler"] = {{"type", "WarmupCosineLR"},
                              {"params", {{"total_num_steps", 2}, {"warmup_num_steps", 2}}}};
  auto warmup = make_single_engine(with_warmup, {256, 16, 2, 2, 32}, 9);
  warmup.engine->save_checkpoint(dir.path(), "warmup_step0");  // before any step: t = -1
  warmup.train(3);
  warmup.engine->save_checkpoint(dir.path(), "warmup_step3");  // t = 2, past the cosine's end

  const std::vector<std::pair<std::string, json>> refused = {{"client", with_warmup},
                                                             {"warmup_step3", with_cosine}};
  for (const auto& [tag, into] : refused) {
    auto e = make_single_engine(into, {256, 16, 2, 2, 32}, 5);
    const auto before = e.weights();
    const auto lr = e.engine->get_lr();
    const std::string msg = message_of([&] { e.engine->load_checkpoint(dir.path(), tag); });
    EXPECT_CONTAINS(msg, "\"lr_scheduler\" state does not load");
    EXPECT_CONTAINS(msg, "load_lr_scheduler_states=false");
    EXPECT_EQ(msg.find("partly loaded"), std::string::npos) << msg;
    EXPECT_TRUE(bit_identical(e.weights(), before)) << tag;
    EXPECT_EQ(e.engine->global_steps(), 0) << tag;
    EXPECT_EQ(e.engine->get_lr(), lr) << tag;
    EXPECT_NO_THROW(e.engine->load_checkpoint(dir.path(), tag, true, true,
                                              /*load_lr_scheduler_states=*/false));
    EXPECT_EQ(e.engine->global_steps(), 3) << tag;
  }
  // A state it can take still loads (t = -1 into WarmupCosineLR: the initial lr).
  auto e = make_single_engine(with_cosine, {256, 16, 2, 2, 32}, 5);
  EXPECT_NO_THROW(e.engine->load_checkpoint(dir.path(), "warmup_step0"));
}

// load_module_only drops the partial accumulation's gradients, and now its micro-steps and their
// loss too: the next step comes after a whole gradient_accumulation_steps, and its loss is the
// mean of those micro-batches alone (before, 2 micro-steps in, it came after 2 more, over the
// loss of all 4).
TEST(CheckpointModuleOnly, LoadedMidAccumulationTheNextStepTakesAWholeAccumulation) {
  dstest::TempDir dir;
  auto saved = make_single_engine(config());
  saved.train(1);
  saved.engine->save_checkpoint(dir.path());
  auto e = make_single_engine(config(/*accumulation=*/4), {256, 16, 2, 2, 32}, 9);
  double loss_sum = 0;
  auto micro_step = [&] {
    auto batch = e.loader->next();
    auto loss = e.engine->forward(batch.data, batch.target);
    loss_sum += loss.item<double>();
    e.engine->backward(loss);
    e.engine->step();
  };
  micro_step();
  micro_step();
  e.engine->load_checkpoint(dir.path(), "", true, true, true, /*load_module_only=*/true);
  EXPECT_EQ(e.engine->micro_steps(), 0);
  loss_sum = 0;
  for (int i = 0; i < 3; ++i) {
    micro_step();
    EXPECT_FALSE(e.engine->was_step_applied()) << "micro-step " << i;
  }
  micro_step();
  EXPECT_TRUE(e.engine->was_step_applied());
  EXPECT_EQ(e.engine->global_steps(), 1);
  EXPECT_NEAR(e.engine->last_loss(), loss_sum / 4, 1e-6);
}

// `latest` is read with whitespace stripped at both ends, as DeepSpeed's strip() (a file written
// by hand or another tool may start with a newline).
TEST(CheckpointLatest, IsTrimmedAtBothEnds) {
  dstest::TempDir dir;
  auto e = make_single_engine(config());
  e.train(2);
  e.engine->save_checkpoint(dir.path());
  std::ofstream(dir / "latest", std::ios::trunc) << "\n  global_step2\t\n";
  EXPECT_EQ(latest(dir.path()), "global_step2");
  auto fresh = make_single_engine(config(), {256, 16, 2, 2, 32}, 9);
  fresh.engine->load_checkpoint(dir.path());
  EXPECT_EQ(fresh.engine->global_steps(), 2);
  EXPECT_TRUE(bit_identical(fresh.weights(), e.weights()));
}

// Parsed so DeepSpeed configs load, but not used: a warning names each key that is turned on.
TEST(CheckpointConfig, KeysParsedButNotUsedWarnWhenOn) {
  for (const char* key : {"load_universal", "use_node_local_storage"}) {
    std::vector<std::string> warnings;
    json c = config();
    c["checkpoint"] = {{key, true}};
    deepspeed::parse_config(c, 1, {}, &warnings);
    std::string all;
    for (const auto& w : warnings) all += w + "\n";
    EXPECT_CONTAINS(all, std::string("'checkpoint.") + key + "' is true but not used");
    warnings.clear();
    c["checkpoint"] = {{key, false}};
    deepspeed::parse_config(c, 1, {}, &warnings);
    EXPECT_TRUE(warnings.empty()) << warnings.front();
  }
}

}  // namespace checkpoint_api_test
