// Checkpoints of tensor-parallel training (docs/checkpoints.md, "Tensor-parallel checkpoints"):
// a run resumed from a save continues bit for bit at tp 2 x dp 2 (ZeRO 1, 2 and 3) and tp 4 x dp 1;
// the checkpoint of a tp 2 run is read whole by ds_to_fp32's consolidation and by init_inference
// at tp 1, 2 and 4 (the slices merged by the layers' rule); a training run of another tensor
// size (or none) reshards it, carrying masters and moments bit for bit; a missing file is named;
// a save failing on one rank leaves the previous checkpoint the one `latest` names, and it loads.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <mutex>

#include "checkpoint/consolidate.h"
#include "checkpoint/fault_injecting_file_system.h"
#include "checkpoint/tag_reader.h"
#include "deepspeed/deepspeed.h"
#include "deepspeed/errors.h"
#include "deepspeed/inference.h"
#include "deepspeed/zero_to_fp32.h"
#include "gpt/model.h"
#include "gpt/tp_model.h"
#include "runtime/engine_checkpoint.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/ranks.h"
#include "support/training_run.h"

namespace tp_checkpoint_test {

namespace {
using deepspeed::comm::CommunicatorPtr;
using Topology = deepspeed::comm::Topology;

std::mutex rng_mutex;  // the rank threads share the global RNG: seeded draws one rank at a time

const gpt::GPTConfig kModel{256, 16, 2, 4, 32};
constexpr int kWorld = 4, kSteps = 20, kSaveAt = 10;

std::shared_ptr<gpt::TPGPTImpl> split_gpt(const std::shared_ptr<Topology>& t) {
  std::shared_ptr<gpt::GPTImpl> full;
  std::shared_ptr<gpt::TPGPTImpl> m;
  {
    std::lock_guard<std::mutex> lock(rng_mutex);
    torch::manual_seed(7);
    full = std::make_shared<gpt::GPTImpl>(kModel);
    m = std::make_shared<gpt::TPGPTImpl>(kModel, t->tensor_parallel());
  }
  m->copy_from(*full);
  return m;
}

// Clipping active, a warm-up schedule and AdamW: a resume that lost any of the norm, the LR
// position, the moments or the data position would change the losses.
nlohmann::json config(int tensor, int stage, bool bf16 = false) {
  auto c = dstest::base_config(8 / (kWorld / tensor), 1, stage);
  if (bf16) c["bf16"] = {{"enabled", true}};
  c["gradient_clipping"] = 0.5;
  c["scheduler"] = {{"type", "WarmupLR"},
                    {"params", {{"warmup_num_steps", 15}, {"warmup_max_lr", 3e-3}}}};
  return c;
}

struct TrainedRun {
  std::vector<double> losses;                              // rank 0's, one per step run
  std::map<int, std::vector<torch::Tensor>> final_slices;  // every rank's parameters at the end
  // Each tensor rank's parameters by name at the save (data-parallel rank 0's).
  std::map<int, std::map<std::string, torch::Tensor>> saved_slices;
};

// Trains tp `tensor` x dp (4 / tensor) at ZeRO `stage` up to step kSteps, saving into `save_dir`
// after step kSaveAt, or first resuming from `load_dir`.
TrainedRun train(int tensor, int stage, const std::string& save_dir, const std::string& load_dir,
                 bool bf16 = false) {
  auto dataset = dstest::test_text_dataset(16);
  TrainedRun out;
  std::mutex mu;
  run_ranks(
      kWorld,
      [&](CommunicatorPtr comm) {
        auto topology = std::make_shared<Topology>(comm, deepspeed::comm::TopologySizes{1, tensor});
        auto model = split_gpt(topology);
        auto [engine, optimizer, loader, scheduler] =
            deepspeed::initialize<gpt::TPGPTImpl>({.model = model,
                                                   .config_json = config(tensor, stage, bf16),
                                                   .training_data = dataset,
                                                   .topology = topology});
        if (!load_dir.empty()) {
          auto [path, client] = engine->load_checkpoint(load_dir);
          EXPECT_NE(path.find("mp_rank_0" + std::to_string(comm->rank() % tensor)),
                    std::string::npos)
              << path;
        }
        std::vector<double> losses;
        while (engine->global_steps() < kSteps) {
          auto batch = loader->next();
          engine->backward(engine->forward(batch.data, batch.target));
          engine->step();
          losses.push_back(engine->last_loss());
          if (!save_dir.empty() && engine->global_steps() == kSaveAt) {
            engine->save_checkpoint(save_dir);
            if (topology->data_parallel()->rank() == 0) {
              std::lock_guard<std::mutex> lock(mu);
              for (auto& p : model->named_parameters())
                out.saved_slices[comm->rank() % tensor][p.key()] = p.value().detach().clone();
            }
          }
        }
        std::lock_guard<std::mutex> lock(mu);
        if (comm->rank() == 0) out.losses = losses;
        for (auto& p : model->parameters())
          out.final_slices[comm->rank()].push_back(p.detach().clone());
      },
      std::chrono::seconds(60));
  return out;
}

// The unsplit tensor from its tensor-parallel slices, by the test's own reading of Megatron's
// layout (examples/gpt/tp_model.h), independent of the checkpoint's merge: q/k/v rows per part,
// MLP fc rows, embedding and head rows by vocabulary, attention and MLP proj by input columns.
torch::Tensor merge(const std::string& name, const std::vector<torch::Tensor>& s) {
  auto ends = [&](const std::string& suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  const int n = static_cast<int>(s.size());
  if (ends("attn.qkv.weight") || ends("attn.qkv.bias")) {
    std::vector<torch::Tensor> parts;
    for (const auto& t : s) {
      auto shape = t.sizes().vec();
      shape[0] /= 3;
      shape.insert(shape.begin(), 3);
      parts.push_back(t.reshape(shape));
    }
    auto whole = torch::cat(parts, 1);
    auto shape = s[0].sizes().vec();
    shape[0] *= n;
    return whole.reshape(shape);
  }
  if (ends("proj.weight")) return torch::cat(s, 1);
  if (ends("mlp.fc.weight") || ends("mlp.fc.bias") || name == "wte.weight" || name == "head.weight")
    return torch::cat(s, 0);
  return s[0];  // replicated
}

// One fixture for every test: the runs are the expensive part, shared.
class TpCheckpoint : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { dir_ = new dstest::TempDir("ds_tp_ckpt"); }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
    runs_.clear();
  }
  // The uninterrupted run of a layout (saving at kSaveAt into dir/<name>), run once.
  static const TrainedRun& uninterrupted(int tensor, int stage) {
    const std::string key = name(tensor, stage);
    auto it = runs_.find(key);
    if (it == runs_.end()) it = runs_.emplace(key, train(tensor, stage, (*dir_) / key, "")).first;
    return it->second;
  }
  static std::string name(int tensor, int stage) {
    return "tp" + std::to_string(tensor) + "_zero" + std::to_string(stage);
  }
  static dstest::TempDir* dir_;
  static std::map<std::string, TrainedRun> runs_;

  void expect_exact_resume(int tensor, int stage) {
    const TrainedRun& ref = uninterrupted(tensor, stage);
    ASSERT_EQ(ref.losses.size(), size_t(kSteps));
    const TrainedRun resumed = train(tensor, stage, "", (*dir_) / name(tensor, stage));
    ASSERT_EQ(resumed.losses.size(), size_t(kSteps - kSaveAt));
    for (int i = 0; i < kSteps - kSaveAt; ++i)
      EXPECT_EQ(resumed.losses[i], ref.losses[kSaveAt + i])
          << name(tensor, stage) << ", step " << kSaveAt + i + 1;
    for (const auto& [rank, slices] : ref.final_slices) {
      const auto& got = resumed.final_slices.at(rank);
      ASSERT_EQ(got.size(), slices.size());
      for (size_t k = 0; k < slices.size(); ++k)
        EXPECT_TRUE(torch::equal(got[k], slices[k]))
            << name(tensor, stage) << " rank " << rank << " parameter " << k;
    }
    std::printf(
        "%s: steps %d-%d after resuming equal the uninterrupted run bit for bit (loss %.6f)\n",
        name(tensor, stage).c_str(), kSaveAt + 1, kSteps, resumed.losses.back());
  }
};
dstest::TempDir* TpCheckpoint::dir_ = nullptr;
std::map<std::string, TrainedRun> TpCheckpoint::runs_;

TEST_F(TpCheckpoint, ResumeIsBitExactAtTp2Dp2Zero1) { expect_exact_resume(2, 1); }
TEST_F(TpCheckpoint, ResumeIsBitExactAtTp2Dp2Zero2) { expect_exact_resume(2, 2); }
TEST_F(TpCheckpoint, ResumeIsBitExactAtTp4Dp1) { expect_exact_resume(4, 1); }
TEST_F(TpCheckpoint, ResumeIsBitExactAtTp2Dp2Zero3) { expect_exact_resume(2, 3); }

TEST_F(TpCheckpoint, LayoutIsOneModelFilePerTensorRank) {
  uninterrupted(2, 1);
  const std::string tag = (*dir_) / (name(2, 1) + "/global_step10");
  for (const char* f :
       {"mp_rank_00_model_states.safetensors", "mp_rank_01_model_states.safetensors",
        "zero_pp_rank_0_mp_rank_00_optim_states.safetensors",
        "zero_pp_rank_1_mp_rank_00_optim_states.safetensors",
        "zero_pp_rank_0_mp_rank_01_optim_states.safetensors",
        "zero_pp_rank_1_mp_rank_01_optim_states.safetensors", "manifest.json"})
    EXPECT_TRUE(std::filesystem::exists(tag + "/" + f)) << f;
}

// The unsplit weights at the save, merged by the test from the ranks' slices.
std::map<std::string, torch::Tensor> whole_at_save(const TrainedRun& run) {
  std::map<std::string, torch::Tensor> out;
  const int tensor = static_cast<int>(run.saved_slices.size());
  for (const auto& [name, t] : run.saved_slices.at(0)) {
    std::vector<torch::Tensor> slices;
    for (int r = 0; r < tensor; ++r) slices.push_back(run.saved_slices.at(r).at(name));
    out[name] = merge(name, slices);
  }
  return out;
}

// ZeRO-1 and ZeRO-3 (whose fragments follow its units' layout).
TEST_F(TpCheckpoint, ExportOfTp2IsTheMergedModel) {
  for (int stage : {1, 3}) {
    const auto whole = whole_at_save(uninterrupted(2, stage));
    const auto exported =
        deepspeed::get_fp32_state_dict_from_zero_checkpoint((*dir_) / name(2, stage));
    size_t params = 0;
    for (const auto& [param, t] : exported) {
      auto it = whole.find(param);
      if (it == whole.end()) continue;  // buffers (the causal masks)
      ++params;
      EXPECT_TRUE(torch::equal(t, it->second))
          << name(2, stage) << " " << param << ": " << t.sizes() << " vs " << it->second.sizes();
    }
    EXPECT_EQ(params, whole.size()) << name(2, stage);
  }
}

TEST_F(TpCheckpoint, InferenceAtTp124FromTp2TrainingEqualsTheTrainedModel) {
  const auto whole = whole_at_save(uninterrupted(2, 1));
  std::shared_ptr<gpt::GPTImpl> ref_model;
  {
    std::lock_guard<std::mutex> lock(rng_mutex);
    ref_model = std::make_shared<gpt::GPTImpl>(kModel);
  }
  torch::NoGradGuard no_grad;
  for (auto& p : ref_model->named_parameters()) p.value().copy_(whole.at(p.key()));
  ref_model->eval();
  auto gen = at::detail::createCPUGenerator(3);
  const auto idx = torch::randint(256, {3, 12}, gen, torch::kLong);
  const auto ref = ref_model->logits(idx);
  for (int tp : {1, 2, 4}) {
    run_ranks(
        kWorld,
        [&](CommunicatorPtr comm) {
          torch::NoGradGuard no_grad;
          std::shared_ptr<gpt::GPTImpl> model;
          {
            std::lock_guard<std::mutex> lock(rng_mutex);
            torch::manual_seed(
                1234);  // other weights than the trained ones: the load must replace them
            model = std::make_shared<gpt::GPTImpl>(kModel);
          }
          auto engine = deepspeed::init_inference(
              model, {.tp_size = tp, .checkpoint = (*dir_) / name(2, 1), .comm = comm});
          const double diff = (model->logits(idx) - ref).abs().max().item<double>();
          EXPECT_LT(diff, 1e-5) << "tp " << tp;
          if (comm->rank() == 0)
            std::printf("init_inference tp %d from a tp 2 checkpoint: logits within %.2e\n", tp,
                        diff);
        },
        std::chrono::seconds(60));
  }
}

// Loads the tp 2 x dp 2 (ZeRO-1) checkpoint of step 10 into tp `tensor` x dp (4 / tensor), or
// into the plain GPT at world 4 (tensor 0), at ZeRO `stage`; saves it again at once into
// `resave` and trains on to step kSteps. Returns rank 0's losses of steps 11-20.
template <class Model>
std::vector<double> load_save_and_train(deepspeed::InitializeResult<Model> r, const std::string& ck,
                                        const std::string& resave) {
  r.engine->load_checkpoint(ck);
  EXPECT_EQ(r.engine->global_steps(), kSaveAt);
  r.engine->save_checkpoint(resave);
  std::vector<double> losses;
  while (r.engine->global_steps() < kSteps) {
    auto batch = r.training_dataloader->next();
    r.engine->backward(r.engine->forward(batch.data, batch.target));
    r.engine->step();
    losses.push_back(r.engine->last_loss());
  }
  return losses;
}

std::vector<double> resume_resharded(int tensor, int stage, const std::string& ck,
                                     const std::string& resave, bool bf16 = false) {
  auto dataset = dstest::test_text_dataset(16);
  std::vector<double> out;
  std::mutex mu;
  run_ranks(
      kWorld,
      [&](CommunicatorPtr comm) {
        std::vector<double> losses;
        if (tensor == 0) {
          std::shared_ptr<gpt::GPTImpl> model;
          {
            std::lock_guard<std::mutex> lock(rng_mutex);
            torch::manual_seed(1234);  // not the saved weights: the load must replace them
            model = std::make_shared<gpt::GPTImpl>(kModel);
          }
          losses = load_save_and_train(
              deepspeed::initialize<gpt::GPTImpl>({.model = model,
                                                   .config_json = config(1, stage, bf16),
                                                   .training_data = dataset,
                                                   .comm = comm}),
              ck, resave);
        } else {
          auto topology =
              std::make_shared<Topology>(comm, deepspeed::comm::TopologySizes{1, tensor});
          losses = load_save_and_train(
              deepspeed::initialize<gpt::TPGPTImpl>({.model = split_gpt(topology),
                                                     .config_json = config(tensor, stage, bf16),
                                                     .training_data = dataset,
                                                     .topology = topology}),
              ck, resave);
        }
        std::lock_guard<std::mutex> lock(mu);
        if (comm->rank() == 0) out = losses;
      },
      std::chrono::seconds(60));
  return out;
}

// Another tensor size reshards: each rank's new slices are assembled from the saved ones (the
// plain model reads them merged). Saved again at once, the masters and both Adam moments of every
// parameter are the checkpoint's, bit for bit; training on follows the uninterrupted run within
// 1e-5 (only summation orders differ).
TEST_F(TpCheckpoint, AnotherTensorSizeReshards) {
  namespace ckpt = deepspeed::checkpoint;
  const TrainedRun& ref = uninterrupted(2, 1);
  struct Target {
    int tensor, stage;
    std::string from;  // the checkpoint loaded
  };
  // The last one loads the plain model's re-save (a checkpoint without tensor parallelism, at
  // dp 4) back into tp 2 x dp 2.
  for (Target t : {Target{4, 1, name(2, 1)}, Target{0, 2, name(2, 1)}, Target{4, 3, name(2, 1)},
                   Target{2, 1, "resharded_plain_zero2"}}) {
    const std::string ck = (*dir_) / t.from;
    const std::string label =
        (t.tensor ? name(t.tensor, t.stage) : "plain_zero" + std::to_string(t.stage)) +
        (t.from == name(2, 1) ? "" : "_from_plain");
    const std::string resave = (*dir_) / ("resharded_" + label);
    const auto losses = resume_resharded(t.tensor, t.stage, ck, resave);
    auto& fs = ckpt::posix_file_system();
    for (const char* kind : {"fp32", "exp_avg", "exp_avg_sq"}) {
      const auto want = ckpt::consolidate_trainable(fs, ck + "/global_step10", kind);
      const auto got = ckpt::consolidate_trainable(fs, resave + "/global_step10", kind);
      ASSERT_EQ(got.size(), want.size()) << label;
      for (size_t k = 0; k < want.size(); ++k) {
        EXPECT_EQ(got[k].first, want[k].first) << label;
        EXPECT_TRUE(torch::equal(got[k].second, want[k].second))
            << label << " " << kind << " " << want[k].first;
      }
    }
    ASSERT_EQ(losses.size(), size_t(kSteps - kSaveAt)) << label;
    double worst = 0;
    for (int i = 0; i < kSteps - kSaveAt; ++i) {
      const double want = ref.losses[kSaveAt + i];
      worst = std::max(worst, std::abs(losses[i] - want) / want);
      EXPECT_NEAR(losses[i], want, 1e-5 * want) << label << ", step " << kSaveAt + i + 1;
    }
    std::printf(
        "%s checkpoint resumed at %s: masters and moments bit-identical, steps 11-20 "
        "within %.2e relative\n",
        t.from.c_str(), label.c_str(), worst);
  }
}

// In bf16 the checkpoint holds 16-bit model slices beside the fp32 masters: resharding tp 2 ->
// tp 4 must carry the masters and moments bit for bit (the 16-bit copies are derived from them).
TEST_F(TpCheckpoint, Bf16ReshardsAcrossTensorSizes) {
  namespace ckpt = deepspeed::checkpoint;
  const std::string ck = (*dir_) / "tp2_zero1_bf16";
  const TrainedRun ref = train(2, 1, ck, "", /*bf16=*/true);
  ASSERT_EQ(ref.losses.size(), size_t(kSteps));
  ASSERT_EQ(ref.final_slices.at(0).front().scalar_type(), torch::kBFloat16);
  const std::string resave = (*dir_) / "resharded_tp4_zero1_bf16";
  const auto losses = resume_resharded(4, 1, ck, resave, /*bf16=*/true);
  auto& fs = ckpt::posix_file_system();
  for (const char* kind : {"fp32", "exp_avg", "exp_avg_sq"}) {
    const auto want = ckpt::consolidate_trainable(fs, ck + "/global_step10", kind);
    const auto got = ckpt::consolidate_trainable(fs, resave + "/global_step10", kind);
    ASSERT_EQ(got.size(), want.size()) << kind;
    for (size_t k = 0; k < want.size(); ++k)
      EXPECT_TRUE(torch::equal(got[k].second, want[k].second)) << kind << " " << want[k].first;
  }
  // bf16 forward passes at another tensor size round differently; the losses stay close.
  ASSERT_EQ(losses.size(), size_t(kSteps - kSaveAt));
  for (int i = 0; i < kSteps - kSaveAt; ++i)
    EXPECT_NEAR(losses[i], ref.losses[kSaveAt + i], 2e-2 * ref.losses[kSaveAt + i])
        << "step " << kSaveAt + i + 1;
}

// What cannot be resharded is named: a tensor size that does not divide a split dimension, and a
// model cutting a parameter otherwise than the checkpoint (q/k/v not as 3 fused blocks).
TEST_F(TpCheckpoint, ReshardingRefusalsNameTheParameter) {
  namespace ckpt = deepspeed::checkpoint;
  uninterrupted(2, 1);
  const std::string tag = (*dir_) / (name(2, 1) + "/global_step10");
  ckpt::TagReader reader(ckpt::posix_file_system(), tag);
  const auto saved = reader.splits();
  EXPECT_EQ(saved.at("block0.attn.qkv.weight").parts, 3);
  EXPECT_EQ(saved.at("block0.attn.proj.weight").dim, 1);
  std::string e = dstest::message_of<std::exception>([&] { reader.view_as_tensor_rank(3, 0, saved); });
  EXPECT_NE(e.find("which tensor-parallel size 3 does not divide"), std::string::npos) << e;
  auto unfused = saved;
  unfused["block1.attn.qkv.bias"].parts = 1;
  e = dstest::message_of<std::exception>(
      [&] { ckpt::TagReader(ckpt::posix_file_system(), tag).view_as_tensor_rank(4, 0, unfused); });
  EXPECT_NE(
      e.find("\"block1.attn.qkv.bias\" was saved dim 0 in 3 block(s) over tensor-parallel size 2, "
             "the model cuts it dim 0 in 1 block(s)"),
      std::string::npos)
      << e;
}

TEST_F(TpCheckpoint, AMissingSliceFileIsNamed) {
  uninterrupted(2, 1);
  const std::string copy = (*dir_) / "missing";
  std::filesystem::copy((*dir_) / name(2, 1), copy, std::filesystem::copy_options::recursive);
  const std::string gone = "zero_pp_rank_1_mp_rank_01_optim_states.safetensors";
  std::filesystem::remove(copy + "/global_step10/" + gone);
  // A training run at the same topology: the rank reading it names it (every rank fails).
  run_ranks(kWorld, [&](CommunicatorPtr comm) {
    auto topology = std::make_shared<Topology>(comm, deepspeed::comm::TopologySizes{1, 2});
    auto model = split_gpt(topology);
    auto [engine, o, l, s] = deepspeed::initialize<gpt::TPGPTImpl>(
        {.model = model, .config_json = config(2, 1), .topology = topology});
    const std::string e = dstest::message_of<std::exception>([&] { engine->load_checkpoint(copy); });
    EXPECT_NE(e.find("load_checkpoint"), std::string::npos) << e;
    if (comm->rank() == 3) EXPECT_NE(e.find(gone), std::string::npos) << e;
  });
  // Inference reads tensor rank 1's slices from it whatever its tp_size.
  const std::string e = dstest::message_of<std::exception>([&] {
    std::shared_ptr<gpt::GPTImpl> model;
    {
      std::lock_guard<std::mutex> lock(rng_mutex);
      model = std::make_shared<gpt::GPTImpl>(kModel);
    }
    deepspeed::init_inference(model, {.tp_size = 1, .checkpoint = copy});
  });
  EXPECT_NE(e.find(gone), std::string::npos) << e;
}

// Loaded at another tensor size, a split tensor is assembled from every tensor rank's model
// file: a damaged one of them is refused while the load checks, naming it, before any weight
// changes. Before, only tensor rank 0's files were checked and the damage showed while applying
// ("the engine may be partly loaded").
TEST_F(TpCheckpoint, ADamagedSliceOfAnotherTensorRankIsRefusedBeforeAnythingChanges) {
  uninterrupted(2, 1);
  const std::string copy = (*dir_) / "damaged";
  std::filesystem::copy((*dir_) / name(2, 1), copy, std::filesystem::copy_options::recursive);
  const std::string damaged = "mp_rank_01_model_states.safetensors";
  const std::string path = copy + "/global_step10/" + damaged;
  std::string bytes = dstest::read_bytes(path);
  bytes[bytes.size() - 8] ^= 0x20;
  dstest::write_bytes(path, bytes);
  run_ranks(kWorld, [&](CommunicatorPtr comm) {
    std::shared_ptr<gpt::GPTImpl> model;
    {
      std::lock_guard<std::mutex> lock(rng_mutex);
      torch::manual_seed(1234);
      model = std::make_shared<gpt::GPTImpl>(kModel);
    }
    auto r = deepspeed::initialize<gpt::GPTImpl>(
        {.model = model, .config_json = config(1, 1), .comm = comm});
    std::vector<torch::Tensor> before;
    for (auto& p : r.engine->module().parameters()) before.push_back(p.detach().clone());
    const std::string e = dstest::message_of<std::exception>([&] { r.engine->load_checkpoint(copy); });
    EXPECT_NE(e.find(damaged), std::string::npos) << e;
    EXPECT_EQ(e.find("partly loaded"), std::string::npos) << e;
    size_t i = 0;
    for (auto& p : r.engine->module().parameters())
      EXPECT_TRUE(torch::equal(p, before[i++])) << "parameter " << i << " changed";
  });
}

// The crash safety of every save (docs/checkpoints.md) holds for the per-tensor-rank files: a
// full disk while tensor rank 1's data-parallel rank 1 writes fails every rank, names the file,
// publishes nothing, and the previous checkpoint stays `latest` and loads.
TEST(TpCheckpointFaults, AFailedSliceWriteKeepsThePreviousCheckpoint) {
  namespace ckpt = deepspeed::checkpoint;
  dstest::TempDir dir("ds_tp_fault");
  std::vector<std::string> errors(kWorld);
  run_ranks(kWorld, [&](CommunicatorPtr comm) {
    auto topology = std::make_shared<Topology>(comm, deepspeed::comm::TopologySizes{1, 2});
    auto [engine, o, l, s] = deepspeed::initialize<gpt::TPGPTImpl>(
        {.model = split_gpt(topology), .config_json = config(2, 1), .topology = topology});
    engine->save_checkpoint(dir.path(), "good");
    ckpt::FaultInjectingFileSystem fs(ckpt::posix_file_system());
    if (comm->rank() == 3) fs.fail_at(ckpt::FsOp::kWrite, 1, ENOSPC);
    ckpt::SaveOptions options;
    options.tag = "bad";
    try {
      ckpt::save_engine_checkpoint(deepspeed::state_of(*engine), fs, dir.path(), options);
    } catch (const deepspeed::CheckpointError& e) {
      errors[comm->rank()] = e.what();
    }
  });
  for (int r = 0; r < kWorld; ++r)
    EXPECT_FALSE(errors[r].empty()) << "rank " << r << " did not throw";
  EXPECT_NE(errors[3].find("zero_pp_rank_1_mp_rank_01_optim_states"), std::string::npos)
      << errors[3];
  EXPECT_EQ(ckpt::read_latest_tag(ckpt::posix_file_system(), dir.path()), "good");
  EXPECT_FALSE(std::filesystem::exists(dir / "bad/manifest.json"));
  run_ranks(kWorld, [&](CommunicatorPtr comm) {
    auto topology = std::make_shared<Topology>(comm, deepspeed::comm::TopologySizes{1, 2});
    auto [engine, o, l, s] = deepspeed::initialize<gpt::TPGPTImpl>(
        {.model = split_gpt(topology), .config_json = config(2, 1), .topology = topology});
    EXPECT_NE(engine->load_checkpoint(dir.path()).load_path.find("good"), std::string::npos);
  });
}

}  // namespace

}  // namespace tp_checkpoint_test
