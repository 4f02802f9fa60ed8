// Checkpoints of tensor x pipeline parallelism (world = pipe x data x tensor; docs/checkpoints.md,
// "Tensor x pipeline checkpoints"), on the tiny example GPT with 4 heads and its embedding split by
// vocabulary and tied to the head across the first and last stage:
// - DeepSpeed's layer_LL-model_TT / mp_rank_MM (MM = stage * T + tensor rank) layout, and a resume
//   at pipe 2 x tensor 2 x data 1 (ZeRO 0 and 1) and pipe 2 x tensor 2 x data 2 (ZeRO 1, and
//   ZeRO 2 untied with the layer files spread over the data ranks) that continues bit for bit: the losses, and the masters and Adam moments at the
//   end, equal an uninterrupted run's;
// - loading into another tensor size (pipe 2 x tensor 1 and 4), another pipeline (pipe 1 x
//   tensor 2) and both (pipe 4 x tensor 1), and back: masters and moments bit-identical after each
//   hop; the weights alone (load_module_only: from the layer files) at tensor sizes 1 and 2;
// - ds_to_fp32 and init_inference (tp 1 and 2) read it as the unsplit model;
// - a save failing on one rank keeps the previous `latest`, which loads;
// - a tensor size that cannot divide the saved slices is refused naming both sizes.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <map>
#include <mutex>

#include <torch/torch.h>

#include "checkpoint/consolidate.h"
#include "checkpoint/fault_injecting_file_system.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "checkpoint/tag_reader.h"
#include "deepspeed/errors.h"
#include "deepspeed/inference.h"
#include "deepspeed/pipe.h"
#include "deepspeed/topology.h"
#include "gpt/generate.h"
#include "gpt/model.h"
#include "gpt/pipeline_model.h"
#include "gpt/tp_pipeline_model.h"
#include "runtime/engine_checkpoint.h"
#include "runtime/engine_state.h"
#include "support/checkpoint_run.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/pipeline_gpt.h"
#include "support/ranks.h"
#include "support/training_run.h"

namespace tp_pipeline_checkpoint_test {

namespace ckpt = deepspeed::checkpoint;
namespace dp = deepspeed::pipe;
namespace fs = std::filesystem;

namespace {

// The tiny pipeline GPT (tied embedding and head unless said otherwise) with 4 heads, so that
// tensor size 4 cuts it too.
gpt::GPTConfig model_config(bool tied = true) {
  gpt::GPTConfig c = dstest::tiny_pipeline_gpt(tied);
  c.n_head = 4;
  return c;
}

struct Layout {
  int stages = 2;
  int tensor = 2;
  int zero = 1;
  int world = dstest::kPipeWorld;
  bool tied = true;  // ZeRO-2 takes no tied layers (initialize_pipeline)
  bool spread = false;  // checkpoint.parallel_write.pipeline_stage: layer files over data ranks
  std::string name() const {
    return "pipe " + std::to_string(stages) + " x tensor " + std::to_string(tensor) + " x data " +
           std::to_string(world / stages / tensor) + " (ZeRO-" + std::to_string(zero) + ")";
  }
};

struct TrainOptions {
  std::string load_dir;  // load (DIR/latest) through Engine::load_checkpoint before training
  std::string save_dir;  // save after training
  ckpt::FileSystem* rank2_fs = nullptr;  // rank 2's file system for the save (fault injection)
  bool module_only = false;  // load_module_only: the weights from the layer files alone
  nlohmann::json config_patch = nlohmann::json::object();
};

// Trains steps [from, to) of the global batch sequence on `l` (every layout sees the same global
// batches) and returns world rank 0's batch losses.
std::vector<double> train(const Layout& l, int from, int to, const TrainOptions& o = {}) {
  std::vector<double> losses;
  std::mutex mu;
  run_ranks(l.world, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto topology = std::make_shared<deepspeed::comm::Topology>(
        comm, deepspeed::comm::TopologySizes{l.stages, l.tensor});
    const int data = topology->grid().data_size();
    dp::PipelineInitializeArgs args;
    const auto c = model_config(l.tied);
    args.model =
        l.tensor > 1 ? gpt::gpt_tp_pipeline(c, topology->tensor_parallel()) : gpt::gpt_pipeline(c);
    args.model.num_stages = l.stages;
    args.config_json = dstest::pipeline_config(data, l.zero);
    args.config_json.merge_patch(o.config_patch);
    if (l.spread) args.config_json["checkpoint"] = {{"parallel_write", {{"pipeline_stage", true}}}};
    args.topology = topology;
    args.device = "cpu";
    auto engine = dp::initialize_pipeline(args);
    if (!o.load_dir.empty()) {
      const auto loaded = engine->load_checkpoint(o.load_dir, "", /*load_module_strict=*/true,
                                                  true, true, /*load_module_only=*/o.module_only);
      EXPECT_FALSE(loaded.load_path.empty());
      if (!o.module_only) EXPECT_EQ(engine->global_steps(), from);
    }
    const int d = topology->coordinates().data;
    std::vector<double> mine;
    for (int k = from; k < to; ++k) {
      int m = 0;
      mine.push_back(
          engine->train_batch([&] { return dstest::pipeline_micro_batch(k, (m++) * data + d); }));
    }
    if (!o.save_dir.empty()) {
      ckpt::FileSystem& fsys =
          comm->rank() == 2 && o.rank2_fs ? *o.rank2_fs : ckpt::posix_file_system();
      ckpt::save_engine_checkpoint(deepspeed::state_of(*engine), fsys, o.save_dir, {});
    }
    std::lock_guard<std::mutex> lock(mu);
    if (comm->rank() == 0) losses = mine;
  });
  return losses;
}

// The micro-batches eval_loss feeds at data-parallel size 1: kPipeGlobalMicro of step 100 (not
// trained on).
std::vector<dp::MicroBatch> eval_micro_batches() {
  std::vector<dp::MicroBatch> out;
  for (int g = 0; g < dstest::kPipeGlobalMicro; ++g)
    out.push_back(dstest::pipeline_micro_batch(100, g));
  return out;
}

// The pipeline's own loss on eval_micro_batches(): the pipeline of layout `l` (data-parallel size
// 1) loads `load_dir` (its own layer files, by layer index: no gpt::checkpoint_names) and returns
// eval_batch's mean. The reference for init_inference and gpt::load_weights, which both map the
// model's names to the layer files through gpt::checkpoint_names.
double eval_loss(const Layout& l, const std::string& load_dir) {
  const auto batches = eval_micro_batches();
  double loss = 0.0;
  std::mutex mu;
  run_ranks(l.world, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto topology = std::make_shared<deepspeed::comm::Topology>(
        comm, deepspeed::comm::TopologySizes{l.stages, l.tensor});
    ASSERT_EQ(topology->grid().data_size(), 1);
    dp::PipelineInitializeArgs args;
    const auto c = model_config(l.tied);
    args.model =
        l.tensor > 1 ? gpt::gpt_tp_pipeline(c, topology->tensor_parallel()) : gpt::gpt_pipeline(c);
    args.model.num_stages = l.stages;
    args.config_json = dstest::pipeline_config(1, l.zero);
    args.topology = topology;
    args.device = "cpu";
    auto engine = dp::initialize_pipeline(args);
    EXPECT_FALSE(engine->load_checkpoint(load_dir).load_path.empty());
    size_t m = 0;
    const double mine = engine->eval_batch([&] { return batches.at(m++); });
    EXPECT_EQ(m, batches.size());
    std::lock_guard<std::mutex> lock(mu);
    if (comm->rank() == 0) loss = mine;
  });
  return loss;
}

// The mean cross-entropy of eval_micro_batches() from `logits_of` (tokens -> [B, T, V] logits),
// as gpt_pipeline's loss.
double loss_from_logits(const std::function<at::Tensor(const at::Tensor&)>& logits_of) {
  std::vector<at::Tensor> inputs, labels;
  for (const auto& [x, y] : eval_micro_batches()) {
    inputs.push_back(x);
    labels.push_back(y);
  }
  const auto logits = logits_of(torch::cat(inputs));
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                              torch::cat(labels).reshape({-1}))
      .item<double>();
}

// The checkpoint read whole: masters and moments per parameter, and the metadata.
using Consolidated = dstest::ConsolidatedState;
using dstest::consolidated_state;

// `weights_only`: the fp32 masters alone (a module-only load keeps no moments or counters).
void expect_identical(const Consolidated& a, const Consolidated& b, const std::string& what,
                      bool weights_only = false) {
  for (auto [x, y, kind] : {std::tuple{&a.fp32, &b.fp32, "fp32"},
                            std::tuple{&a.exp_avg, &b.exp_avg, "exp_avg"},
                            std::tuple{&a.exp_avg_sq, &b.exp_avg_sq, "exp_avg_sq"}}) {
    if (weights_only && std::string(kind) != "fp32") continue;
    ASSERT_EQ(x->size(), y->size()) << what << " " << kind;
    std::map<std::string, at::Tensor> theirs(y->begin(), y->end());
    for (const auto& [name, t] : *x) {
      ASSERT_TRUE(theirs.count(name)) << what << ": " << kind << " of " << name << " is missing";
      EXPECT_TRUE(torch::equal(t, theirs.at(name))) << what << ": " << kind << " of " << name;
    }
  }
  if (weights_only) return;
  EXPECT_EQ(a.meta.at("optimizer").at("adam_step"), b.meta.at("optimizer").at("adam_step")) << what;
  EXPECT_EQ(a.meta.at("global_steps"), b.meta.at("global_steps")) << what;
}

std::vector<double> concat(std::vector<double> a, const std::vector<double>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

TEST(TpPipelineCheckpoint, DeepSpeedLayoutAndExactResume) {
  dstest::TempDir root;
  for (const Layout& l :
       {Layout{2, 2, 0}, Layout{2, 2, 1}, Layout{2, 2, 1, 8}, Layout{2, 2, 2, 8, false, true}}) {
    const std::string base = root.path() + "/" + std::to_string(l.zero) + "_" +
                             std::to_string(l.world);
    const auto uninterrupted = train(l, 0, 4, {.save_dir = base + "/whole"});
    const auto first = train(l, 0, 2, {.save_dir = base + "/ck"});
    const auto rest = train(l, 2, 4, {.load_dir = base + "/ck", .save_dir = base + "/resumed"});
    // Bit for bit: the losses, then the masters and moments the two runs end with.
    EXPECT_EQ(concat(first, rest), uninterrupted) << l.name();
    expect_identical(consolidated_state(base + "/whole"), consolidated_state(base + "/resumed"),
                     l.name());
    std::printf("%s: resumed losses equal, final loss %.6f\n", l.name().c_str(),
                uninterrupted.back());
  }

  // DeepSpeed's names (pipe 2 x tensor 2 x data 2): layers 0 (embedding, tied to the head),
  // 1-4 (blocks), 5 (final norm) per tensor rank; mp_rank_MM per (stage, tensor rank).
  const std::string tag = root.path() + "/1_8/ck/global_step2";
  EXPECT_EQ(ckpt::layer_file_name(3, 1), "layer_03-model_01-model_states.safetensors");
  for (int layer = 0; layer <= 5; ++layer)
    for (int t = 0; t < 2; ++t)
      EXPECT_TRUE(fs::exists(tag + "/" + ckpt::layer_file_name(layer, t))) << layer << " " << t;
  EXPECT_FALSE(fs::exists(tag + "/" + ckpt::layer_file_name(0)));
  EXPECT_FALSE(fs::exists(tag + "/" + ckpt::layer_file_name(6, 0)));
  for (int mp = 0; mp < 4; ++mp) {
    EXPECT_TRUE(fs::exists(tag + "/" + ckpt::model_states_file_name(mp))) << mp;
    for (int d = 0; d < 2; ++d)
      EXPECT_TRUE(fs::exists(tag + "/" + ckpt::optim_states_file_name(d, mp))) << d << " " << mp;
  }
  EXPECT_FALSE(fs::exists(tag + "/" + ckpt::model_states_file_name(4)));
  const auto meta = ckpt::read_manifest(ckpt::posix_file_system(), tag).metadata;
  EXPECT_EQ(meta.at("world_size"), 8);
  EXPECT_EQ(meta.at("pipeline").at("stages"), 2);
  EXPECT_EQ(meta.at("tensor_parallel").at("size"), 2);
  EXPECT_EQ(meta.at("tensor_parallel").at("data_parallel_size"), 2);
  // Every stage's cuts: stage 0's embedding and first blocks, stage 1's last block.
  const auto& split = meta.at("tensor_parallel").at("split");
  EXPECT_TRUE(split.contains("tied_embed.wte.weight")) << split.dump();
  EXPECT_TRUE(split.contains("layer_01.attn.qkv.weight")) << split.dump();
  EXPECT_TRUE(split.contains("layer_04.mlp.fc.weight")) << split.dump();
  EXPECT_EQ(split.at("layer_04.mlp.proj.weight").at("dim"), 1);
  // Global rank (stage * D + d) * T + t reads zero_pp_rank_d_mp_rank_(stage * T + t).
  EXPECT_EQ(meta.at("partitions").at(7).at("file"), ckpt::optim_states_file_name(1, 3));
  EXPECT_EQ(meta.at("partitions").at(7).at("tensor_rank"), 1);
}

// Saved at pipe 2 x tensor 2 x data 1 (ZeRO-1), loaded at another tensor size (1, and 4 on 8
// ranks: each stage compares its own layers' cuts with the checkpoint's), another pipeline and
// both, and from those back; each loaded engine saves again at once and the checkpoint, read
// whole, must be the original bit for bit.
TEST(TpPipelineCheckpoint, ReshardsAcrossTensorAndPipelineLayouts) {
  dstest::TempDir root;
  const std::string a = root.path() + "/a";
  train({2, 2, 1}, 0, 2, {.save_dir = a});
  const Consolidated saved = consolidated_state(a);
  ASSERT_FALSE(saved.fp32.empty());

  struct Hop {
    std::string from, to;
    Layout layout;
  };
  const std::string p2t1 = root.path() + "/p2t1", p1t2 = root.path() + "/p1t2";
  const std::vector<Hop> hops = {{a, p2t1, {2, 1, 1}},
                                 {a, p1t2, {1, 2, 1}},
                                 {a, root.path() + "/p4t1", {4, 1, 0}},
                                 {a, root.path() + "/p2t4", {2, 4, 1, 8}},
                                 {p2t1, root.path() + "/back_from_t1", {2, 2, 0}},
                                 {p1t2, root.path() + "/back_from_p1", {2, 2, 1}}};
  for (const auto& hop : hops) {
    train(hop.layout, 2, 2, {.load_dir = hop.from, .save_dir = hop.to});
    expect_identical(saved, consolidated_state(hop.to),
                     fs::path(hop.from).filename().string() + " -> " + hop.layout.name());
  }
  // load_module_only takes the weights from the layer files alone (the optimizer's fragments
  // untouched): merged from both tensor ranks' files at tensor size 1, each rank's own file at 2.
  for (const Layout& l : {Layout{2, 1, 1}, Layout{1, 2, 1}}) {
    const std::string to = root.path() + "/module_only_" + std::to_string(l.tensor);
    train(l, 2, 2, {.load_dir = a, .save_dir = to, .module_only = true});
    expect_identical(saved, consolidated_state(to), "module only -> " + l.name(), true);
  }
  // Training goes on after resharding as it would have (only summation orders differ).
  const auto uninterrupted = train({2, 2, 1}, 0, 4);
  const std::vector<double> tail(uninterrupted.begin() + 2, uninterrupted.end());
  for (const Layout& l : {Layout{1, 2, 1}, Layout{2, 1, 1}}) {
    const auto resumed = train(l, 2, 4, {.load_dir = a});
    EXPECT_LT(dstest::max_rel_diff(resumed, tail), dstest::kLossTol) << l.name();
  }
}

// ds_to_fp32 and init_inference read the pipe 2 x tensor 2 checkpoint as the unsplit model: the
// export equals that of the same weights saved by a one-rank, one-stage engine, and the logits of
// init_inference at tp 1 and 2 equal those of the whole model loaded from that plain checkpoint.
// gpt::load_weights and init_inference both map names through gpt::checkpoint_names (a wrong
// mapping would load the same wrong model on both sides), so their loss on a batch is compared
// with the saving pipeline's own eval_batch loss as well.
TEST(TpPipelineCheckpoint, ExportAndInferenceReadTheUnsplitModel) {
  dstest::TempDir root;
  const std::string split_ck = root.path() + "/split", plain_ck = root.path() + "/plain";
  train({2, 2, 1}, 0, 3, {.save_dir = split_ck});
  train({1, 1, 1, 1}, 3, 3, {.load_dir = split_ck, .save_dir = plain_ck});

  auto& fsys = ckpt::posix_file_system();
  const auto exported = ckpt::consolidate_fp32(fsys, ckpt::resolve_tag_dir(fsys, split_ck));
  const auto plain = ckpt::consolidate_fp32(fsys, ckpt::resolve_tag_dir(fsys, plain_ck));
  std::map<std::string, at::Tensor> want(plain.begin(), plain.end());
  EXPECT_EQ(exported.size(), plain.size());
  for (const auto& [name, t] : exported) {
    ASSERT_TRUE(want.count(name)) << name;
    EXPECT_TRUE(torch::equal(t, want.at(name))) << name << ": " << t.sizes();
  }

  const gpt::GPTConfig config = model_config();
  auto whole = std::make_shared<gpt::GPTImpl>(config);
  gpt::load_weights(*whole, plain_ck);
  whole->eval();
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(3);
  const auto idx = torch::randint(config.vocab_size, {3, config.block_size}, gen, torch::kLong);
  const auto ref = whole->logits(idx);
  // Only summation orders differ (about 1e-7 relative); blocks 0 and 1 swapped move the loss by
  // 1e-4 relative.
  const double pipe_loss = eval_loss({2, 2, 1}, split_ck);
  EXPECT_NEAR(loss_from_logits([&](const at::Tensor& x) { return whole->logits(x); }), pipe_loss,
              2e-6 * pipe_loss)
      << "gpt::load_weights";
  for (int tp : {1, 2}) {
    run_ranks(tp, [&](deepspeed::comm::CommunicatorPtr comm) {
      torch::NoGradGuard no_grad;
      auto model = std::make_shared<gpt::GPTImpl>(config);
      auto engine = deepspeed::init_inference(
          model, {.tp_size = tp,
                  .checkpoint = split_ck,
                  .checkpoint_names =
                      [config](const std::string& n) { return gpt::checkpoint_names(n, config); },
                  .comm = comm});
      const double diff = (model->logits(idx) - ref).abs().max().item<double>();
      EXPECT_LT(diff, 1e-5) << "tp " << tp;
      EXPECT_NEAR(loss_from_logits([&](const at::Tensor& x) { return model->logits(x); }),
                  pipe_loss, 2e-6 * pipe_loss)
          << "init_inference tp " << tp;
      if (comm->rank() == 0)
        std::printf("init_inference tp %d from pipe 2 x tensor 2: logits within %.2e\n", tp, diff);
    });
  }
}

// A layer file that cannot be written (ENOSPC on rank 2: stage 1, tensor rank 0): every rank
// throws, `latest` still names the previous checkpoint, which loads.
TEST(TpPipelineCheckpoint, FailedSaveKeepsThePreviousCheckpoint) {
  dstest::TempDir root;
  const std::string dir = root.path() + "/ck";
  train({2, 2, 1}, 0, 1, {.save_dir = dir});
  ckpt::FaultInjectingFileSystem faulty(ckpt::posix_file_system());
  faulty.fail_at(ckpt::FsOp::kCreate, 2, ENOSPC);  // its optim file first, then its layer files
  std::string error;
  try {
    train({2, 2, 1}, 1, 2, {.load_dir = dir, .save_dir = dir, .rank2_fs = &faulty});
  } catch (const std::exception& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("save_checkpoint"), std::string::npos) << error;
  EXPECT_EQ(ckpt::posix_file_system().read_file(dir + "/latest"), "global_step1");
  EXPECT_FALSE(fs::exists(dir + "/global_step2/" + ckpt::kManifestFileName));
  train({2, 2, 1}, 1, 2, {.load_dir = dir});
}

// SGD's momentum buffers (saved per element as Adam's moments are, "sgd_fragments") resume bit
// for bit at the same layout and are resharded at another tensor size and pipeline; training
// then goes on as it would have (only summation orders differ).
TEST(TpPipelineCheckpoint, SgdStateResumesAtTheSameAndOtherLayouts) {
  dstest::TempDir root;
  const std::string dir = root.path() + "/ck";
  const nlohmann::json sgd = {
      {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}, {"momentum", 0.9}}}}}};
  const Layout l{2, 2, 0};
  const auto uninterrupted = train(l, 0, 4, {.config_patch = sgd});
  const auto first = train(l, 0, 2, {.save_dir = dir, .config_patch = sgd});
  const auto rest = train(l, 2, 4, {.load_dir = dir, .config_patch = sgd});
  EXPECT_EQ(concat(first, rest), uninterrupted);
  EXPECT_EQ(consolidated_state(dir).meta["optimizer"]["format"], "sgd_fragments");
  const std::vector<double> tail(uninterrupted.begin() + 2, uninterrupted.end());
  for (const Layout& other : {Layout{2, 1, 0}, Layout{1, 2, 1}}) {
    const auto resumed = train(other, 2, 4, {.load_dir = dir, .config_patch = sgd});
    EXPECT_LT(dstest::max_rel_diff(resumed, tail), dstest::kLossTol) << other.name();
  }
}

// Tensor size 3 cannot cut what size 2 saved (the model's 4 heads, vocabulary 64): refused,
// naming the saved size and the asked one.
TEST(TpPipelineCheckpoint, AnUndividableTensorSizeIsRefusedNamingBothSizes) {
  dstest::TempDir root;
  const std::string dir = root.path() + "/ck";
  train({2, 2, 1}, 0, 1, {.save_dir = dir});
  auto& fsys = ckpt::posix_file_system();
  ckpt::TagReader reader(fsys, ckpt::resolve_tag_dir(fsys, dir));
  EXPECT_EQ(reader.tensor_parallel_size(), 2);
  EXPECT_EQ(reader.pipeline_stages(), 2);
  const std::string e = dstest::message_of<deepspeed::CheckpointError>(
      [&] { reader.view_as_tensor_rank(3, 0, reader.splits()); });
  EXPECT_CONTAINS(e, "saved at tensor-parallel size 2");
  EXPECT_CONTAINS(e, "size 3 does not divide");
}

}  // namespace tp_pipeline_checkpoint_test
