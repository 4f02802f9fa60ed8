// The optimizer's parameter-group options come back with a checkpoint's optimizer state, as
// DeepSpeed's optimizer.load_state_dict restores its param_groups (lr, betas, eps, weight_decay,
// ...): a job resumed with other options (another construction, a client that set them
// otherwise) steps with the saved ones, and continues the uninterrupted run bit for bit. A
// config scheduler, loaded after them, still sets the lr; load_optimizer_states=false keeps the
// new run's options; a checkpoint saved before the options were (no "param_groups") loads as
// before; another number of groups is refused (runtime/checkpoint_group_options.h).
#include <gtest/gtest.h>

#include <mutex>

#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "deepspeed/errors.h"
#include "deepspeed/pipe.h"
#include "optim/fused_adam.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/param_groups.h"
#include "support/pipeline_gpt.h"
#include "support/ranks.h"
#include "support/training_run.h"

namespace group_options_checkpoint_test {

namespace {
using nlohmann::json;
namespace ckpt = deepspeed::checkpoint;

constexpr int kSaveAt = 3;
constexpr int kSteps = 6;

// One group's options as AdamWOptions holds them.
struct GroupOptions {
  double lr = 1e-3;
  double weight_decay = 0.0;
  std::pair<double, double> betas{0.9, 0.999};
  double eps = 1e-8;
  bool operator==(const GroupOptions& o) const {
    return lr == o.lr && weight_decay == o.weight_decay && betas == o.betas && eps == o.eps;
  }
};
using TwoGroups = std::pair<GroupOptions, GroupOptions>;  // vectors' group, matrices' group

std::ostream& operator<<(std::ostream& os, const GroupOptions& g) {
  return os << "{lr " << g.lr << ", wd " << g.weight_decay << ", betas (" << g.betas.first << ", "
            << g.betas.second << "), eps " << g.eps << "}";
}

// What the checkpoint is saved with: vectors (biases, LayerNorm weights) at lr 1e-3 without
// decay, matrices at lr 2e-3 with weight decay 0.1.
const TwoGroups kSaved{{1e-3, 0.0}, {2e-3, 0.1}};
// What the resumed job is built with: every option otherwise.
const TwoGroups kOther{{5e-3, 0.3, {0.8, 0.9}, 1e-6}, {4e-3, 0.0, {0.7, 0.95}, 1e-7}};

torch::optim::AdamWOptions adamw_options(const GroupOptions& g) {
  return torch::optim::AdamWOptions(g.lr)
      .weight_decay(g.weight_decay)
      .betas({g.betas.first, g.betas.second})
      .eps(g.eps);
}

json options_json(const GroupOptions& g) {
  return {{"lr", g.lr},
          {"weight_decay", g.weight_decay},
          {"betas", {g.betas.first, g.betas.second}},
          {"eps", g.eps}};
}

using ClientFactory = std::function<std::shared_ptr<torch::optim::Optimizer>(gpt::GPTImpl&)>;

// The project's FusedAdam (Adam-format checkpoints) with the two groups.
ClientFactory fused_adam(const TwoGroups& o) {
  return [o](gpt::GPTImpl& m) {
    auto [matrices, vectors] = dstest::matrices_and_vectors(m);
    deepspeed::AdamHyper h;
    h.lr = o.first.lr;
    h.weight_decay = o.first.weight_decay;
    h.beta1 = o.first.betas.first;
    h.beta2 = o.first.betas.second;
    h.eps = o.first.eps;
    auto adam = std::make_shared<deepspeed::optim::FusedAdam>(vectors, h);
    adam->add_param_group(torch::optim::OptimizerParamGroup(
        matrices, std::make_unique<torch::optim::AdamWOptions>(adamw_options(o.second))));
    return adam;
  };
}

// libtorch's AdamW: a libtorch archive in memory, the CPU Adam under offload_optimizer.
ClientFactory torch_adamw(const TwoGroups& o) {
  return [o](gpt::GPTImpl& m) {
    auto [matrices, vectors] = dstest::matrices_and_vectors(m);
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(vectors,
                        std::make_unique<torch::optim::AdamWOptions>(adamw_options(o.first)));
    groups.emplace_back(matrices,
                        std::make_unique<torch::optim::AdamWOptions>(adamw_options(o.second)));
    return std::make_shared<torch::optim::AdamW>(groups, adamw_options(o.first));
  };
}

// The config's AdamW over InitializeArgs.model_parameters.
std::function<std::vector<deepspeed::ParamGroup>(gpt::GPTImpl&)> config_groups(const TwoGroups& o) {
  return [o](gpt::GPTImpl& m) {
    auto [matrices, vectors] = dstest::matrices_and_vectors(m);
    return std::vector<deepspeed::ParamGroup>{{vectors, options_json(o.first)},
                                              {matrices, options_json(o.second)}};
  };
}

// How the engine's optimizer is made from a TwoGroups.
enum class Kind { kFusedAdam, kTorchAdamW, kConfigGroups };

dstest::RunSpec spec(int world, int stage, Kind kind, const TwoGroups& o, const json& extra) {
  dstest::RunSpec s;
  s.world_size = world;
  s.steps = kSteps;
  s.config = dstest::base_config(2, 1, stage);
  if (stage == 3) s.config["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
  if (!extra.is_null()) s.config.merge_patch(extra);
  if (kind == Kind::kConfigGroups) {
    s.model_parameters = config_groups(o);
  } else {
    s.config.erase("optimizer");
    s.client_optimizer = kind == Kind::kFusedAdam ? fused_adam(o) : torch_adamw(o);
  }
  return s;
}

std::vector<GroupOptions> options_of(deepspeed::Engine& engine) {
  std::vector<GroupOptions> out;
  for (auto& group : engine.optimizer()->param_groups()) {
    auto& o = static_cast<torch::optim::AdamWOptions&>(group.options());
    out.push_back(
        {o.lr(), o.weight_decay(), {std::get<0>(o.betas()), std::get<1>(o.betas())}, o.eps()});
  }
  return out;
}

std::vector<GroupOptions> as_list(const TwoGroups& o) { return {o.first, o.second}; }

struct Resumed {
  dstest::RunResult run;
  std::vector<GroupOptions> loaded;  // rank 0's groups right after the load
};

// Trains `saving` to kSaveAt and saves there; then trains `resuming` from that checkpoint
// (loaded with `load_optimizer_states`) to kSteps.
Resumed save_and_resume(dstest::RunSpec saving, dstest::RunSpec resuming,
                        bool load_optimizer_states = true,
                        const std::function<void(const std::string&)>& between = {}) {
  dstest::TempDir dir;
  saving.steps = kSaveAt;
  saving.after_training = [&](deepspeed::Engine& e) { e.save_checkpoint(dir.path()); };
  dstest::train_gpt(saving);
  if (between) between(dir.path());
  Resumed out;
  std::mutex mu;
  resuming.model_seed = 11;  // the load must win
  resuming.before_training = [&](deepspeed::Engine& e) {
    e.load_checkpoint(dir.path(), "", true, load_optimizer_states);
    std::lock_guard<std::mutex> lock(mu);
    if (e.communicator()->rank() == 0) out.loaded = options_of(e);
  };
  out.run = dstest::train_gpt(resuming);
  return out;
}

// The resumed job has the saved options and continues the uninterrupted run bit for bit.
void expect_exact_resume(int world, int stage, Kind kind, const json& extra = json(),
                         const std::function<json()>& fresh_extra = {}) {
  auto with = [&](json e) {
    if (fresh_extra) e.merge_patch(fresh_extra());  // e.g. a new swap folder per run
    return e;
  };
  const auto uninterrupted = dstest::train_gpt(spec(world, stage, kind, kSaved, with(extra)));
  const auto resumed = save_and_resume(spec(world, stage, kind, kSaved, with(extra)),
                                       spec(world, stage, kind, kOther, with(extra)));
  EXPECT_EQ(resumed.loaded, as_list(kSaved));
  const std::vector<double> tail(uninterrupted.losses.begin() + kSaveAt,
                                 uninterrupted.losses.end());
  EXPECT_EQ(resumed.run.losses, tail);
  EXPECT_EQ(dstest::max_weight_diff(resumed.run, uninterrupted), 0.0);
}

// Rewrites the checkpoint under save_dir (its `latest`) as one saved before the group options
// were: the optim files without "param_groups", the manifest's sizes and checksums updated.
void strip_group_options(const std::string& save_dir) {
  const std::string tag = dstest::read_bytes(save_dir + "/latest");
  const std::string dir = save_dir + "/" + tag;
  auto& fs = ckpt::posix_file_system();
  ckpt::Manifest manifest = ckpt::read_manifest(fs, dir);
  int stripped = 0;
  for (auto& [name, entry] : manifest.files) {
    if (name.find("optim_states") == std::string::npos) continue;
    const std::string path = dir + "/" + name;
    auto file = ckpt::read_safetensors(path);
    json meta = json::parse(file.metadata.at(ckpt::kMetadataKey));
    stripped += static_cast<int>(meta.erase("param_groups"));
    file.metadata[ckpt::kMetadataKey] = meta.dump();
    ckpt::write_safetensors(path, file.tensors, file.metadata);
    entry = ckpt::describe_file(fs, path);
  }
  ASSERT_GT(stripped, 0) << "no optim file held param_groups";
  ckpt::write_manifest(fs, dir, manifest);
}

}  // namespace

// A client FusedAdam with two groups (an Adam-format checkpoint: masters and moments as
// fragments) at stage 0 (the module's own parameters), 2 and 3 over two ranks.
TEST(GroupOptionsCheckpoint, FusedAdamGroupsComeBackAtStagesZeroTwoThree) {
  for (int stage : {0, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    expect_exact_resume(2, stage, Kind::kFusedAdam);
  }
}

// Under offload_optimizer "cpu" a client AdamW runs as the CPU Adam (FusedAdam) with its groups'
// options: whole at the step, and range by range during backward (overlap_step).
TEST(GroupOptionsCheckpoint, CpuOffloadedAdamGroupsComeBack) {
  for (bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlap_step" : "at the step");
    expect_exact_resume(
        2, 2, Kind::kTorchAdamW,
        {{"zero_optimization",
          {{"offload_optimizer", {{"device", "cpu"}, {"overlap_step", overlap}}}}}});
  }
}

// offload_optimizer "nvme": the swapped Adam reads its groups' options at every step.
TEST(GroupOptionsCheckpoint, NvmeSwappedAdamGroupsComeBack) {
  std::vector<std::unique_ptr<dstest::TempDir>> swaps;
  expect_exact_resume(2, 2, Kind::kTorchAdamW, json(), [&swaps] {
    swaps.push_back(std::make_unique<dstest::TempDir>());
    return json{{"zero_optimization",
                 {{"offload_optimizer",
                   {{"device", "nvme"}, {"nvme_path", swaps.back()->path()}, {"buffer_count", 3}}},
                  {"sub_group_size", 1000}}},
                {"aio", {{"block_size", 8192}, {"queue_depth", 4}}}};
  });
}

// The config's "optimizer" block over InitializeArgs.model_parameters.
TEST(GroupOptionsCheckpoint, ConfigOptimizerGroupsComeBack) {
  for (int stage : {1, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    expect_exact_resume(2, stage, Kind::kConfigGroups);
  }
}

// A libtorch optimizer's archive holds the options too; libtorch's own load reads past them.
TEST(GroupOptionsCheckpoint, LibtorchArchiveGroupsComeBack) {
  for (int stage : {0, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    expect_exact_resume(2, stage, Kind::kTorchAdamW);
  }
}

// A config scheduler is loaded after the options: it sets the lr (DeepSpeed's schedulers do on
// their next step), and the other options are the saved ones. The same schedule continues the
// uninterrupted run bit for bit; another one's lr is the one the groups get.
TEST(GroupOptionsCheckpoint, SchedulerSetsTheLrAfterTheLoad) {
  auto warmup = [](double max_lr) {
    return json{
        {"scheduler",
         {{"type", "WarmupLR"},
          {"params",
           {{"warmup_min_lr", 0.0}, {"warmup_max_lr", max_lr}, {"warmup_num_steps", 10}}}}}};
  };
  const auto uninterrupted = dstest::train_gpt(spec(2, 2, Kind::kFusedAdam, kSaved, warmup(3e-3)));
  auto resumed = save_and_resume(spec(2, 2, Kind::kFusedAdam, kSaved, warmup(3e-3)),
                                 spec(2, 2, Kind::kFusedAdam, kOther, warmup(3e-3)));
  ASSERT_EQ(resumed.loaded.size(), 2u);
  for (int g = 0; g < 2; ++g) {
    GroupOptions want = as_list(kSaved)[g];
    EXPECT_NE(resumed.loaded[g].lr, want.lr);  // the schedule's, not the group's own
    want.lr = resumed.loaded[g].lr;
    EXPECT_EQ(resumed.loaded[g], want) << "group " << g;
  }
  const std::vector<double> tail(uninterrupted.losses.begin() + kSaveAt,
                                 uninterrupted.losses.end());
  EXPECT_EQ(resumed.run.losses, tail);
  EXPECT_EQ(dstest::max_weight_diff(resumed.run, uninterrupted), 0.0);

  // Another peak: the new schedule's lr at the saved step, as a fresh run of it has there.
  std::vector<double> fresh_lr;
  auto fresh = spec(2, 2, Kind::kFusedAdam, kSaved, warmup(9e-3));
  fresh.steps = kSaveAt;
  fresh.after_training = [&](deepspeed::Engine& e) {
    if (e.communicator()->rank() == 0) fresh_lr = e.get_lr();
  };
  dstest::train_gpt(fresh);
  auto rescheduled = save_and_resume(spec(2, 2, Kind::kFusedAdam, kSaved, warmup(3e-3)),
                                     spec(2, 2, Kind::kFusedAdam, kOther, warmup(9e-3)));
  ASSERT_EQ(rescheduled.loaded.size(), 2u);
  ASSERT_EQ(fresh_lr.size(), 2u);
  for (int g = 0; g < 2; ++g) {
    EXPECT_EQ(rescheduled.loaded[g].lr, fresh_lr[g]) << "group " << g;
    EXPECT_EQ(rescheduled.loaded[g].weight_decay, as_list(kSaved)[g].weight_decay);
  }
}

// Without the optimizer states nothing of the optimizer comes back: the new run's options stay.
TEST(GroupOptionsCheckpoint, WithoutOptimizerStatesTheNewOptionsStay) {
  for (Kind kind : {Kind::kFusedAdam, Kind::kTorchAdamW}) {
    auto resumed =
        save_and_resume(spec(2, 2, kind, kSaved, json()), spec(2, 2, kind, kOther, json()),
                        /*load_optimizer_states=*/false);
    EXPECT_EQ(resumed.loaded, as_list(kOther));
  }
}

// A checkpoint saved before the options were saved loads as it did: the new run's options stay,
// the masters and moments come back.
TEST(GroupOptionsCheckpoint, CheckpointWithoutGroupOptionsStillLoads) {
  for (int stage : {0, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    // Resumed with the saved options, it is the uninterrupted run.
    const auto uninterrupted = dstest::train_gpt(spec(2, stage, Kind::kFusedAdam, kSaved, json()));
    auto same = save_and_resume(spec(2, stage, Kind::kFusedAdam, kSaved, json()),
                                spec(2, stage, Kind::kFusedAdam, kSaved, json()), true,
                                strip_group_options);
    const std::vector<double> tail(uninterrupted.losses.begin() + kSaveAt,
                                   uninterrupted.losses.end());
    EXPECT_EQ(same.run.losses, tail);
    EXPECT_EQ(dstest::max_weight_diff(same.run, uninterrupted), 0.0);
    auto other = save_and_resume(spec(2, stage, Kind::kFusedAdam, kSaved, json()),
                                 spec(2, stage, Kind::kFusedAdam, kOther, json()), true,
                                 strip_group_options);
    EXPECT_EQ(other.loaded, as_list(kOther));
  }
}

// Another number of groups is refused, naming the tag, both counts and the way out, as
// DeepSpeed's optimizer load refuses it; without the optimizer states it loads.
TEST(GroupOptionsCheckpoint, AnotherGroupCountIsRefused) {
  auto one_group = spec(2, 2, Kind::kFusedAdam, kOther, json());
  one_group.client_optimizer = nullptr;
  one_group.config = dstest::base_config(2, 1, 2);  // the config's AdamW, one group
  const std::string msg = dstest::message_of<deepspeed::CheckpointError>(
      [&] { save_and_resume(spec(2, 2, Kind::kFusedAdam, kSaved, json()), one_group); });
  EXPECT_CONTAINS(msg, "global_step3");
  EXPECT_CONTAINS(msg, "saved with 2 parameter group(s)");
  EXPECT_CONTAINS(msg, "now has 1");
  EXPECT_CONTAINS(msg, "load_optimizer_states=false");
  auto weights_only =
      save_and_resume(spec(2, 2, Kind::kFusedAdam, kSaved, json()), one_group, false);
  EXPECT_EQ(weights_only.loaded.size(), 1u);
}

// A pipeline's stages save their own optimizer's options in their optim files; each stage takes
// those of the stage that saved the layers it loads first, at the same pipeline and at another.
TEST(GroupOptionsCheckpoint, PipelineStagesTakeTheSavedOptions) {
  namespace dp = deepspeed::pipe;
  dstest::TempDir dir;
  constexpr int kWorld = dstest::kPipeWorld;
  // Trains pipe `stages` x data (kWorld / stages) steps [from, to) with AdamW at `lr`, loading
  // before and saving after when asked; returns rank 0's losses and every rank's group lr.
  auto train = [&](int stages, int from, int to, double lr, bool load, bool save,
                   std::vector<double>* lrs) {
    std::vector<double> losses;
    std::mutex mu;
    if (lrs) lrs->assign(kWorld, 0.0);
    dstest::run_ranks(kWorld, [&](deepspeed::comm::CommunicatorPtr comm) {
      auto args = dstest::pipeline_args(comm, stages, /*zero_stage=*/1,
                                        dstest::tiny_pipeline_gpt(/*tied=*/true));
      args.config_json["optimizer"]["params"]["lr"] = lr;
      auto engine = dp::initialize_pipeline(args);
      if (load) engine->load_checkpoint(dir.path());
      if (lrs) (*lrs)[comm->rank()] = engine->get_lr().at(0);
      const std::vector<double> mine = dstest::train_pipeline_steps(*engine, comm, from, to);
      if (save) engine->save_checkpoint(dir.path());
      std::lock_guard<std::mutex> lock(mu);
      if (comm->rank() == 0) losses = mine;
    });
    return losses;
  };
  const auto uninterrupted = train(2, 0, 4, 2e-3, false, false, nullptr);
  train(2, 0, 2, 2e-3, false, true, nullptr);
  std::vector<double> lrs;
  const auto resumed = train(2, 2, 4, 7e-3, true, false, &lrs);
  EXPECT_EQ(lrs, std::vector<double>(kWorld, 2e-3));
  EXPECT_EQ(resumed, std::vector<double>(uninterrupted.begin() + 2, uninterrupted.end()));
  train(4, 2, 2, 7e-3, true, false, &lrs);  // resharded across stages: load only
  EXPECT_EQ(lrs, std::vector<double>(kWorld, 2e-3));
}

}  // namespace group_options_checkpoint_test
