// Checkpoints of a pipeline (4 ranks as threads, the tiny example GPT with a tied embedding and
// head): DeepSpeed's per-layer layout, exact resume at pipe 2 x data 2, resharding to pipe 1 x
// data 4, pipe 4 x data 1 and back (fp32 masters and Adam moments bit-identical after each
// round trip, and training continues as uninterrupted), the ds_to_fp32 export, a failed save that
// leaves the previous checkpoint, and a mismatched model refused by name.
#include <gtest/gtest.h>

#include <filesystem>
#include <mutex>
#include <set>

#include <torch/torch.h>

#include "checkpoint/consolidate.h"
#include "checkpoint/fault_injecting_file_system.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "deepspeed/errors.h"
#include "deepspeed/pipe.h"
#include "gpt/pipeline_model.h"
#include "runtime/engine_checkpoint.h"
#include "runtime/engine_state.h"
#include "support/checkpoint_run.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/pipeline_gpt.h"
#include "support/ranks.h"
#include "support/training_run.h"

namespace pipeline_checkpoint_test {

namespace ckpt = deepspeed::checkpoint;
namespace dp = deepspeed::pipe;
namespace fs = std::filesystem;

namespace {

constexpr int kWorld = dstest::kPipeWorld;

struct Layout {
  int stages = 2;
  int zero = 1;
};

struct TrainOptions {
  std::string load_dir;  // load (DIR/latest) before training
  std::string save_dir;  // save after training
  nlohmann::json config_overrides = nlohmann::json::object();
  gpt::GPTConfig model = dstest::tiny_pipeline_gpt(/*tied=*/true);
  // Rank 2's file system for the save (the others use the real one), for fault injection.
  ckpt::FileSystem* rank2_fs = nullptr;
};

// Trains steps [from, to) of the global batch sequence on `layout` and returns the batch losses
// (every rank reports them; rank 0's are returned).
std::vector<double> train(Layout layout, int from, int to, const TrainOptions& o = {}) {
  std::vector<double> losses;
  std::mutex mu;
  run_ranks(kWorld, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto args = dstest::pipeline_args(comm, layout.stages, layout.zero, o.model);
    args.config_json.merge_patch(o.config_overrides);
    auto engine = dp::initialize_pipeline(args);
    if (!o.load_dir.empty()) {
      auto loaded = engine->load_checkpoint(o.load_dir);
      EXPECT_FALSE(loaded.load_path.empty());
      EXPECT_EQ(engine->global_steps(), from);
    }
    const std::vector<double> mine = dstest::train_pipeline_steps(*engine, comm, from, to);
    if (!o.save_dir.empty()) {
      ckpt::FileSystem& fs = comm->rank() == 2 && o.rank2_fs ? *o.rank2_fs : ckpt::posix_file_system();
      ckpt::save_engine_checkpoint(deepspeed::state_of(*engine), fs, o.save_dir, {});
    }
    std::lock_guard<std::mutex> lock(mu);
    if (comm->rank() == 0) losses = mine;
  });
  return losses;
}

// The checkpoint read whole: masters and moments per parameter, and the metadata.
using Consolidated = dstest::ConsolidatedState;
using dstest::consolidated_state;

void expect_identical(const Consolidated& a, const Consolidated& b, const std::string& what) {
  for (auto [x, y, kind] : {std::tuple{&a.fp32, &b.fp32, "fp32"},
                            std::tuple{&a.exp_avg, &b.exp_avg, "exp_avg"},
                            std::tuple{&a.exp_avg_sq, &b.exp_avg_sq, "exp_avg_sq"}}) {
    ASSERT_EQ(x->size(), y->size()) << what << " " << kind;
    for (size_t i = 0; i < x->size(); ++i) {
      EXPECT_EQ((*x)[i].first, (*y)[i].first) << what;
      EXPECT_TRUE(torch::equal((*x)[i].second, (*y)[i].second))
          << what << ": " << kind << " of " << (*x)[i].first;
    }
  }
  EXPECT_EQ(a.meta.at("optimizer").at("adam_step"), b.meta.at("optimizer").at("adam_step")) << what;
  EXPECT_EQ(a.meta.at("global_steps"), b.meta.at("global_steps")) << what;
}

std::vector<double> concat(std::vector<double> a, const std::vector<double>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

TEST(PipelineCheckpoint, DeepSpeedLayoutAndExactResumeAtTwoByTwo) {
  dstest::TempDir root;
  const std::string dir = root.path() + "/ck";
  const auto uninterrupted = train({2, 1}, 0, 6);
  const auto first = train({2, 1}, 0, 3, {.save_dir = dir});
  const auto rest = train({2, 1}, 3, 6, {.load_dir = dir});
  // Bit for bit: masters, moments, Adam step, counters and the RNG states all came back.
  EXPECT_EQ(concat(first, rest), uninterrupted);

  const std::string tag = dir + "/global_step3";
  // The example GPT's layers: 0 embedding (tied), 1-4 blocks, 5 final norm, 6 head (tied: its
  // weights are the embedding's, in layer 0's file).
  for (int layer = 0; layer <= 5; ++layer)
    EXPECT_TRUE(fs::exists(tag + "/" + ckpt::layer_file_name(layer))) << layer;
  EXPECT_FALSE(fs::exists(tag + "/" + ckpt::layer_file_name(6)));
  for (int stage = 0; stage < 2; ++stage) {
    EXPECT_TRUE(fs::exists(tag + "/" + ckpt::model_states_file_name(stage)));
    for (int d = 0; d < 2; ++d)
      EXPECT_TRUE(fs::exists(tag + "/" + ckpt::optim_states_file_name(d, stage))) << d << " " << stage;
  }
  EXPECT_EQ(ckpt::layer_file_name(0), "layer_00-model_states.safetensors");
  EXPECT_EQ(ckpt::optim_states_file_name(1, 1), "zero_pp_rank_1_mp_rank_01_optim_states.safetensors");
  const auto meta = ckpt::read_manifest(ckpt::posix_file_system(), tag).metadata;
  EXPECT_EQ(meta.at("pipeline").at("stages"), 2);
  EXPECT_EQ(meta.at("world_size"), 4);
  // The tied embedding (token and position tables) is listed once among the trainable parameters.
  std::multiset<std::string> names;
  for (const auto& t : meta.at("trainable")) names.insert(t.at("name").get<std::string>());
  EXPECT_EQ(names.count("tied_embed.wte.weight"), 1u);
  EXPECT_EQ(names.count("tied_embed.wpe.weight"), 1u);
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size());
}

// Saved at pipe 2 x data 2 (ZeRO-1), loaded at pipe 1 x data 4 (ZeRO-2), pipe 4 x data 1 (ZeRO-1)
// and from those back at pipe 2 x data 2 (ZeRO-0 and 1); each loaded engine saves again at once
// and the consolidated masters and moments must be the original's bit for bit.
TEST(PipelineCheckpoint, ReshardsAcrossPipelineAndDataLayouts) {
  dstest::TempDir root;
  const std::string a = root.path() + "/a";
  train({2, 1}, 0, 2, {.save_dir = a});
  const Consolidated saved = consolidated_state(a);
  ASSERT_FALSE(saved.fp32.empty());

  struct Hop {
    std::string from, to;
    Layout layout;
  };
  const std::vector<Hop> hops = {{a, root.path() + "/p1d4", {1, 2}},
                                 {a, root.path() + "/p4d1", {4, 1}},
                                 {root.path() + "/p4d1", root.path() + "/back_from_p4", {2, 0}},
                                 {root.path() + "/p1d4", root.path() + "/back_from_p1", {2, 1}}};
  for (const auto& hop : hops) {
    train(hop.layout, 2, 2, {.load_dir = hop.from, .save_dir = hop.to});
    expect_identical(saved, consolidated_state(hop.to),
                     hop.from + " -> pipe " + std::to_string(hop.layout.stages));
  }

  // Training goes on after resharding as it would have: pipe 4 x data 1 from the 2 x 2
  // checkpoint against the uninterrupted 2 x 2 run (same global batches; only summation orders
  // differ, hence kLossTol rather than equality).
  const auto uninterrupted = train({2, 1}, 0, 4);
  const auto resumed = train({4, 1}, 2, 4, {.load_dir = a});
  const std::vector<double> tail(uninterrupted.begin() + 2, uninterrupted.end());
  EXPECT_LT(dstest::max_rel_diff(resumed, tail), dstest::kLossTol);
}

// ds_to_fp32 on a pipeline checkpoint: every module tensor once (the tied embedding once), named
// as in the stage modules, equal to the weights a one-stage engine loads from it.
TEST(PipelineCheckpoint, ExportsWholeFp32Model) {
  dstest::TempDir root;
  const std::string dir = root.path() + "/ck";
  train({2, 1}, 0, 2, {.save_dir = dir});
  auto& fsys = ckpt::posix_file_system();
  const auto exported = ckpt::consolidate_fp32(fsys, ckpt::resolve_tag_dir(fsys, dir));
  std::map<std::string, at::Tensor> by_name(exported.begin(), exported.end());
  EXPECT_EQ(by_name.size(), exported.size()) << "a tensor is exported twice";
  EXPECT_TRUE(by_name.count("tied_embed.wte.weight"));
  EXPECT_TRUE(by_name.count("layer_01.attn.qkv.weight"));

  std::mutex mu;
  std::map<std::string, at::Tensor> loaded;
  run_ranks(1, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto engine = dp::initialize_pipeline(dstest::pipeline_args(
        comm, /*stages=*/1, /*zero_stage=*/0, dstest::tiny_pipeline_gpt(/*tied=*/true)));
    engine->load_checkpoint(dir);
    std::lock_guard<std::mutex> lock(mu);
    for (auto& item : engine->module().named_parameters()) loaded[item.key()] = item.value().detach().clone();
    for (auto& item : engine->module().named_buffers()) loaded[item.key()] = item.value().detach().clone();
  });
  ASSERT_EQ(loaded.size(), by_name.size());
  for (const auto& [name, t] : loaded) {
    ASSERT_TRUE(by_name.count(name)) << name;
    EXPECT_TRUE(torch::equal(by_name[name], t.to(torch::kFloat))) << name;
  }
}

// checkpoint.parallel_write.pipeline_stage: the data-parallel ranks of a stage share its layer
// files; the checkpoint is the same.
TEST(PipelineCheckpoint, ParallelWriteGivesTheSameCheckpoint) {
  dstest::TempDir root;
  train({2, 1}, 0, 2, {.save_dir = root.path() + "/serial"});
  train({2, 1}, 0, 2,
        {.save_dir = root.path() + "/spread",
         .config_overrides = {{"checkpoint", {{"parallel_write", {{"pipeline_stage", true}}}}}}});
  expect_identical(consolidated_state(root.path() + "/serial"),
                   consolidated_state(root.path() + "/spread"),
                   "parallel_write");
  auto& fsys = ckpt::posix_file_system();
  for (int layer = 0; layer <= 5; ++layer) {
    const std::string f = "/global_step2/" + ckpt::layer_file_name(layer);
    EXPECT_EQ(fsys.read_file(root.path() + "/serial" + f), fsys.read_file(root.path() + "/spread" + f))
        << f;
  }
}

// A layer file that cannot be written (ENOSPC on stage 1's writer): every rank throws, `latest`
// still names the previous checkpoint, which loads.
TEST(PipelineCheckpoint, FailedSaveKeepsThePreviousCheckpoint) {
  dstest::TempDir root;
  const std::string dir = root.path() + "/ck";
  train({2, 1}, 0, 1, {.save_dir = dir});
  ckpt::FaultInjectingFileSystem faulty(ckpt::posix_file_system());
  // Rank 2 (stage 1, data-parallel rank 0) creates its optim file first, then its layer files.
  faulty.fail_at(ckpt::FsOp::kCreate, 2, ENOSPC);
  std::string error;
  try {
    train({2, 1}, 1, 2, {.load_dir = dir, .save_dir = dir, .rank2_fs = &faulty});
  } catch (const std::exception& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("save_checkpoint"), std::string::npos) << error;
  EXPECT_EQ(ckpt::posix_file_system().read_file(dir + "/latest"), "global_step1");
  EXPECT_FALSE(fs::exists(dir + "/global_step2/" + ckpt::kManifestFileName));
  train({2, 1}, 1, 2, {.load_dir = dir});
}

// Another model's checkpoint is refused, naming the tensor.
TEST(PipelineCheckpoint, MismatchedModelIsRefusedByName) {
  dstest::TempDir root;
  const std::string dir = root.path() + "/ck";
  train({2, 1}, 0, 1, {.save_dir = dir});
  auto wider = dstest::tiny_pipeline_gpt(true);
  wider.n_embd = 32;
  std::string error;
  try {
    train({2, 1}, 1, 1, {.load_dir = dir, .model = wider});
  } catch (const std::exception& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("has shape"), std::string::npos) << error;
  EXPECT_NE(error.find("layer_"), std::string::npos) << error;
}

// A pipeline's checkpoint loaded by an engine without a pipeline, and the reverse: refused naming
// both layouts, not the first tensor name that could not match.
TEST(PipelineCheckpoint, PlainAndPipelineLayoutsRefuseEachOther) {
  dstest::TempDir root;
  const std::string pipe_dir = root.path() + "/pipe", plain_dir = root.path() + "/plain";
  train({2, 1}, 0, 1, {.save_dir = pipe_dir});
  dstest::CheckpointJob plain;
  plain.config = dstest::base_config(2, 1, 1);
  plain.model = dstest::tiny_pipeline_gpt(true);
  plain.model.vocab_size = 256;  // run_checkpoint_job's byte-level text
  plain.steps = 1;
  plain.load_dir = pipe_dir;
  std::string error = dstest::message_of<std::exception>([&] { dstest::run_checkpoint_job(plain); });
  EXPECT_NE(error.find("was saved by a pipeline engine (2 stages"), std::string::npos) << error;
  EXPECT_NE(error.find("is not a PipelineModule"), std::string::npos) << error;

  plain.load_dir.clear();
  plain.save_dir = plain_dir;
  plain.save_at_end = true;
  dstest::run_checkpoint_job(plain);
  error = dstest::message_of<std::exception>([&] { train({2, 1}, 1, 1, {.load_dir = plain_dir}); });
  EXPECT_NE(error.find("was saved without a pipeline"), std::string::npos) << error;
  EXPECT_NE(error.find("runs a PipelineModule"), std::string::npos) << error;
}

// Only the later layers trained (stage 0's layers frozen: its output needs no gradient, so its
// backward has nothing to do; autograd would refuse it). Stage 0 keeps no optimizer state, so
// its own step stays 0 while stage 1's reaches 3: the manifest (written by global rank 0) must
// hold the job's step, or stage 1's moments would resume at step 0 (another bias correction).
// The resume is bit for bit.
TEST(PipelineCheckpoint, AFrozenFirstStageTrainsAndResumesWithTheJobsStep) {
  auto module = [] {
    auto m = gpt::gpt_pipeline(dstest::tiny_pipeline_gpt(/*tied=*/false));
    m.partition_method = "uniform";  // stage 0: the first ceil(n / 2) layers
    for (size_t k = 0; k < (m.layers.size() + 1) / 2; ++k) {
      auto build = m.layers[k].build;
      if (!build) continue;
      m.layers[k].build = [build] {
        torch::nn::AnyModule built = build();
        for (auto& p : built.ptr()->parameters()) p.set_requires_grad(false);
        return built;
      };
    }
    return m;
  };
  auto run = [&](int from, int to, const std::string& save_dir, const std::string& load_dir) {
    std::vector<double> losses;
    std::mutex mu;
    run_ranks(kWorld, [&](deepspeed::comm::CommunicatorPtr comm) {
      auto engine = dp::initialize_pipeline(dstest::pipeline_args(comm, 2, 0, module()));
      if (!load_dir.empty()) engine->load_checkpoint(load_dir);
      const auto mine = dstest::train_pipeline_steps(*engine, comm, from, to);
      if (!save_dir.empty())
        ckpt::save_engine_checkpoint(deepspeed::state_of(*engine), ckpt::posix_file_system(),
                                     save_dir, {});
      std::lock_guard<std::mutex> lock(mu);
      if (comm->rank() == 0) losses = mine;
    });
    return losses;
  };
  dstest::TempDir root;
  const std::string dir = root.path() + "/ck";
  const auto uninterrupted = run(0, 5, "", "");
  ASSERT_EQ(uninterrupted.size(), 5u);
  EXPECT_LT(uninterrupted.back(), uninterrupted.front());  // the later layers learn
  const auto first = run(0, 3, dir, "");
  const auto optimizer = ckpt::read_manifest(ckpt::posix_file_system(), dir + "/global_step3")
                              .metadata.at("optimizer");
  EXPECT_EQ(optimizer.at("format"), "adam_fragments");
  EXPECT_EQ(optimizer.at("adam_step"), 3);
  const auto rest = run(3, 5, "", dir);
  EXPECT_EQ(concat(first, rest), uninterrupted);
}

}  // namespace pipeline_checkpoint_test
