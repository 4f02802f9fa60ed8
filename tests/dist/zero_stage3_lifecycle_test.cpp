// ZeRO stage 3's parameter lifecycle: released storage is really freed, the gathered working set
// respects stage3_max_live_parameters, whole-model access (gathered_parameters with and without a
// modifier rank, consolidated_state_dict), zero::Init, and the model-state bytes (16Ψ/N).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <thread>

#include <mutex>

#include "deepspeed/checkpointing.h"
#include "deepspeed/errors.h"
#include "deepspeed/zero_init.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/ranks.h"
#include "support/stage3_models.h"
#include "support/training_run.h"
#include "zero/stage3/unit_internals.h"

namespace zero_stage3_lifecycle_test {

namespace {
using deepspeed::ZeroUnit;

// A unit that remembers the storage its weight had while it ran.
struct ProbeImpl : torch::nn::Module {
  ProbeImpl() { fc = register_module("fc", torch::nn::Linear(dstest::kWidth, dstest::kWidth)); }
  torch::Tensor forward(const torch::Tensor& x) {
    if (during_forward) during_forward();
    seen_numel = fc->weight.numel();
    seen = c10::weak_intrusive_ptr<c10::StorageImpl>(
        c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(fc->weight.storage().unsafeGetStorageImpl()));
    return x + deepspeed::zero::linear(x, fc->weight, fc->bias);
  }
  torch::nn::Linear fc{nullptr};
  std::function<void()> during_forward;  // runs first, with the unit gathered for its forward
  int64_t seen_numel = 0;
  c10::weak_intrusive_ptr<c10::StorageImpl> seen{c10::intrusive_ptr<c10::StorageImpl>()};
};
TORCH_MODULE(Probe);

struct ProbeModelImpl : torch::nn::Module {
  ProbeModelImpl() {
    embed = register_module("embed", torch::nn::Embedding(dstest::kVocab, dstest::kWidth));
    probe = register_module("probe", std::make_shared<ZeroUnit<Probe>>(Probe()));
    mlp = register_module("mlp", std::make_shared<ZeroUnit<dstest::Mlp>>(dstest::Mlp()));
    head = register_module("head", torch::nn::Linear(dstest::kWidth, dstest::kVocab));
  }
  torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets) {
    auto x = mlp->forward(probe->forward(embed->forward(idx)));
    auto logits = deepspeed::zero::linear(x, head->weight, head->bias);
    return torch::nn::functional::cross_entropy(logits.reshape({-1, dstest::kVocab}), targets.reshape({-1}));
  }
  torch::nn::Embedding embed{nullptr};
  std::shared_ptr<ZeroUnit<Probe>> probe;
  std::shared_ptr<ZeroUnit<dstest::Mlp>> mlp;
  torch::nn::Linear head{nullptr};
};

int64_t storage_nbytes(const torch::Tensor& t) { return static_cast<int64_t>(t.storage().nbytes()); }

// `world` ranks training `model` for `steps` steps at stage 3 (micro batch 2), every parameter
// partitioned (persistence threshold 0).
dstest::RunSpec partitioned_run(int world, int steps, const gpt::GPTConfig& model = dstest::RunSpec{}.model) {
  dstest::RunSpec s;
  s.world_size = world;
  s.steps = steps;
  s.model = model;
  s.config = dstest::base_config(2, 1, 3);
  s.config["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
  return s;
}
}  // namespace

TEST(Stage3Release, StorageIsFreedAfterForwardAndAfterBackward) {
  run_ranks(2, [](deepspeed::comm::CommunicatorPtr comm) {
    torch::manual_seed(3);
    auto model = std::make_shared<ProbeModelImpl>();
    auto engine = dstest::engine_over(model, dstest::stage3_test_config(3), comm);
    auto& weight = model->probe->inner()->fc->weight;
    EXPECT_EQ(weight.numel(), 0);
    EXPECT_EQ(storage_nbytes(weight), 0);
    for (int64_t step = 0; step < 3; ++step) {
      auto b = dstest::token_batch(comm->rank(), step);
      auto loss = engine->forward(b.idx, b.targets);
      // While it ran the weight was whole; now its storage is gone (no view kept it alive).
      EXPECT_EQ(model->probe->inner()->seen_numel, dstest::kWidth * dstest::kWidth);
      // Gloo's worker thread drops its reference to a finished all-gather's buffer a moment after
      // the wait returns, so allow it that moment (a leaked storage never expires).
      for (int spin = 0; spin < 1000 && !model->probe->inner()->seen.expired(); ++spin)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      EXPECT_TRUE(model->probe->inner()->seen.expired()) << "step " << step;
      EXPECT_EQ(storage_nbytes(weight), 0);
      // The last unit's backward comes right after its forward: with stage3_max_reuse_distance 0
      // it is kept from the second step on, once the first step's trace says so.
      const int64_t mlp_bytes = storage_nbytes(model->mlp->inner()->fc->weight);
      if (step == 0)
        EXPECT_EQ(mlp_bytes, 0);
      else
        EXPECT_GE(mlp_bytes, 4 * dstest::kWidth * dstest::kWidth * 4);
      engine->backward(loss);
      EXPECT_EQ(storage_nbytes(weight), 0);
      EXPECT_FALSE(weight.grad().defined());  // the full gradient was freed after reduction
      EXPECT_EQ(engine->memory_report().gathered_numel, 0);
      engine->step();
    }
    // The root unit (embedding, head) stays whole.
    EXPECT_EQ(model->embed->weight.numel(), dstest::kVocab * dstest::kWidth);
    auto m = engine->memory_report();
    EXPECT_GT(m.peak_gathered_numel, 0);
    EXPECT_GE(m.gathered_bytes, (model->embed->weight.numel() + model->head->weight.numel()) * 4);
  });
}

TEST(Stage3MaxLive, PeakGatheredElementsStayUnderTheSetting) {
  gpt::GPTConfig four_layers{256, 16, 4, 2, 32};
  const int64_t block = 12704;  // one block of this GPT (a multiple of 2 x 16: no padding)
  for (int64_t max_live : {block, 3 * block / 2, 2 * block}) {
    dstest::RunSpec s = partitioned_run(2, 3, four_layers);
    s.config["zero_optimization"]["stage3_max_live_parameters"] = max_live;
    s.config["zero_optimization"]["stage3_prefetch_bucket_size"] = 2 * block;
    auto r = dstest::train_gpt(s);
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_LE(r.memory[rank].peak_gathered_numel, max_live) << "max_live " << max_live;
      EXPECT_GE(r.memory[rank].peak_gathered_numel, block) << "max_live " << max_live;
    }
  }
  // DeepSpeed's defaults (1e9) keep every block gathered from its forward to its backward.
  auto r = dstest::train_gpt(partitioned_run(2, 2, four_layers));
  EXPECT_EQ(r.memory[0].peak_gathered_numel, 4 * block);
}

namespace {
// An Mlp with one more trainable parameter that its forward never uses.
struct MlpWithUnusedImpl : torch::nn::Module {
  MlpWithUnusedImpl() {
    mlp = register_module("mlp", dstest::Mlp());
    unused = register_parameter("unused", torch::randn({37}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return mlp->forward(x); }
  dstest::Mlp mlp{nullptr};
  torch::Tensor unused;
};
TORCH_MODULE(MlpWithUnused);

struct LastUnitPartlyUsedImpl : torch::nn::Module {
  LastUnitPartlyUsedImpl() {
    embed = register_module("embed", torch::nn::Embedding(dstest::kVocab, dstest::kWidth));
    first = register_module("first", std::make_shared<ZeroUnit<dstest::Mlp>>(dstest::Mlp()));
    last = register_module("last", std::make_shared<ZeroUnit<MlpWithUnused>>(MlpWithUnused()));
    head = register_module("head", torch::nn::Linear(dstest::kWidth, dstest::kVocab));
  }
  torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets) {
    auto x = embed->forward(idx);
    x = checkpointed ? deepspeed::checkpointing::checkpoint(
                           [this](const torch::Tensor& in) { return first->forward(in); }, x)
                     : first->forward(x);
    x = last->forward(x);
    auto logits = deepspeed::zero::linear(x, head->weight, head->bias);
    return torch::nn::functional::cross_entropy(logits.reshape({-1, dstest::kVocab}),
                                                targets.reshape({-1}));
  }
  torch::nn::Embedding embed{nullptr};
  std::shared_ptr<ZeroUnit<dstest::Mlp>> first;
  std::shared_ptr<ZeroUnit<MlpWithUnused>> last;
  torch::nn::Linear head{nullptr};
  bool checkpointed = false;  // `first` in an activation-checkpointed segment
};

// Three steps of LastUnitPartlyUsed on two ranks with room for one unit; returns the captured
// standard error and sets rank 0's peak of gathered elements.
std::string train_last_unit_partly_used(int64_t unit_numel, bool checkpointed,
                                        int64_t& peak_gathered) {
  auto config = dstest::stage3_test_config(3);
  config["zero_optimization"]["stage3_max_live_parameters"] = unit_numel;
  config["zero_optimization"]["stage3_prefetch_bucket_size"] = 0;
  ::testing::internal::CaptureStderr();
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    torch::manual_seed(3);
    auto model = std::make_shared<LastUnitPartlyUsedImpl>();
    model->checkpointed = checkpointed;
    auto engine = dstest::engine_over(model, config, comm);
    for (int64_t step = 0; step < 3; ++step) {
      auto b = dstest::token_batch(comm->rank(), step);
      engine->backward(engine->forward(b.idx, b.targets));
      EXPECT_EQ(engine->memory_report().gathered_numel, 0) << "released at the end of backward";
      engine->step();
    }
    if (comm->rank() == 0) peak_gathered = engine->memory_report().peak_gathered_numel;
  });
  return ::testing::internal::GetCapturedStderr();
}
}  // namespace

// A parameter the loss's autograd graph cannot reach counts as done when the backward begins
// (zero/backward_reach.h): its unit is released once its other parameters have their gradient,
// and the earlier unit's backward gather stays within stage3_max_live_parameters.
TEST(Stage3MaxLive, AParameterTheGraphCannotReachKeepsNoUnitGathered) {
  const int64_t unit_numel = 8416;  // the last unit, padded (the larger)
  int64_t peak = 0;
  const std::string err = train_last_unit_partly_used(unit_numel, false, peak);
  EXPECT_LE(peak, unit_numel);
  EXPECT_EQ(err.find("got no gradient"), std::string::npos) << err;
}

// A unit is released in backward when all its trainable parameters have their gradient. Where
// the graph cannot tell at the start of backward which parameters it reaches (an activation-
// checkpointed segment shows its parameters only when recomputed), one whose parameter the loss
// never uses stays gathered (unevictable) to the end of the backward, so with room for one unit
// the earlier unit's backward gather goes over stage3_max_live_parameters. The user is told, once
// per unit and rank, which parameter and what it costs.
TEST(Stage3MaxLive, AParameterWithoutGradientIsNamedInAWarning) {
  const int64_t unit_numel = 8416;  // the last unit, padded (the larger)
  int64_t peak = 0;
  const std::string err = train_last_unit_partly_used(unit_numel, true, peak);
  EXPECT_CONTAINS(err, "rank 0, stage 3: last.unused (ZeRO unit 2) got no gradient");
  EXPECT_CONTAINS(err, "rank 1, stage 3: last.unused (ZeRO unit 2) got no gradient");
  EXPECT_CONTAINS(err, "stage3_max_live_parameters does not evict it");
  EXPECT_CONTAINS(err, "requires_grad");
  EXPECT_EQ(dstest::occurrences(err, "got no gradient"), 2u)
      << "once per unit and rank, not per step:\n" << err;
  EXPECT_EQ(err.find("ZeRO unit 1"), std::string::npos) << "the fully used unit is not named";
}

// With releases as early as possible (reuse distance 0), one block is gathered at a time unless
// the next one is prefetched while the current one runs. As in DeepSpeed, the budget is checked
// before a unit is added: half a block's budget still prefetches the next block, a whole one no
// more than that.
TEST(Stage3Prefetch, NextBlockIsGatheredAheadOnlyWhenTheBucketAllowsIt) {
  const int64_t block = 12704;
  for (int64_t prefetch : {int64_t{0}, block / 2, block}) {
    dstest::RunSpec s = partitioned_run(2, 3, gpt::GPTConfig{256, 16, 4, 2, 32});
    s.config["zero_optimization"]["stage3_max_reuse_distance"] = 0;
    s.config["zero_optimization"]["stage3_prefetch_bucket_size"] = prefetch;
    auto r = dstest::train_gpt(s);
    EXPECT_EQ(r.memory[0].peak_gathered_numel, prefetch == 0 ? block : 2 * block)
        << "prefetch " << prefetch;
  }
}

// A step or a checkpoint load inside a gathered_parameters scope would leave the scope's copies
// stale, and a modifier rank's scope would write them back over it: both are refused on every
// rank before any collective, and the scope's end and the step after it go on as usual.
TEST(Stage3Access, AStepInsideAScopeIsRefused) {
  dstest::TempDir ckpt;
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto model = std::make_shared<dstest::OuterModelImpl>();
    auto engine = dstest::engine_over(model, dstest::stage3_test_config(3), comm);
    auto b = dstest::token_batch(comm->rank(), 0);
    engine->save_checkpoint(ckpt.path(), "start");
    engine->backward(engine->forward(b.idx, b.targets));
    {
      auto scope = engine->gathered_parameters(/*modifier_rank=*/0);
      EXPECT_CONTAINS(dstest::message_of<deepspeed::Error>(
                          [&] { engine->load_checkpoint(ckpt.path(), "start"); }),
                      "load_checkpoint inside a gathered_parameters scope on rank ");
      EXPECT_CONTAINS(dstest::message_of<deepspeed::Error>([&] { engine->step(); }),
                      "engine.step() inside a gathered_parameters scope on rank " +
                          std::to_string(comm->rank()));
    }
    engine->step();
    engine->backward(engine->forward(b.idx, b.targets));
    engine->step();
    EXPECT_TRUE(std::isfinite(engine->last_loss()));
  });
}

// A save inside a scope is refused too, on every rank before anything is written: inside a
// modifier scope the module file would get the edited weights and the optim files the masters
// they are not yet written back to.
TEST(Stage3Access, ASaveInsideAScopeIsRefused) {
  dstest::TempDir ckpt;
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto model = std::make_shared<dstest::OuterModelImpl>();
    auto engine = dstest::engine_over(model, dstest::stage3_test_config(3), comm);
    engine->save_checkpoint(ckpt.path(), "start");
    {
      auto scope = engine->gathered_parameters(/*modifier_rank=*/0);
      if (comm->rank() == 0) {
        torch::NoGradGuard no_grad;
        for (auto& p : model->parameters()) p.add_(1.0);
      }
      EXPECT_CONTAINS(dstest::message_of<deepspeed::CheckpointError>(
                          [&] { engine->save_checkpoint(ckpt.path(), "inside"); }),
                      "save_checkpoint inside a gathered_parameters scope on rank " +
                          std::to_string(comm->rank()));
    }
    EXPECT_NO_THROW(engine->save_checkpoint(ckpt.path(), "after"));
  });
  EXPECT_FALSE(std::filesystem::exists(ckpt / "inside"));
  EXPECT_TRUE(std::filesystem::exists(ckpt / "after/manifest.json"));
}

// save_16bit_model inside a scope is refused as save_checkpoint is, on every rank before anything
// is written: inside a modifier scope the file would get the edits that the scope's end may not
// keep (every rank's but the modifier's are dropped).
TEST(Stage3Access, A16BitSaveInsideAScopeIsRefused) {
  dstest::TempDir out;
  auto config = dstest::stage3_test_config(3);
  config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = true;
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto model = std::make_shared<dstest::OuterModelImpl>();
    auto engine = deepspeed::initialize<dstest::OuterModelImpl>(
                      {.model = model, .config_json = config, .comm = comm})
                      .engine;
    {
      auto scope = engine->gathered_parameters(/*modifier_rank=*/0);
      EXPECT_CONTAINS(dstest::message_of<deepspeed::CheckpointError>(
                          [&] { engine->save_16bit_model(out / "inside"); }),
                      "save_16bit_model inside a gathered_parameters scope on rank " +
                          std::to_string(comm->rank()));
    }
    EXPECT_TRUE(engine->save_16bit_model(out / "after"));
  });
  EXPECT_FALSE(std::filesystem::exists(out / "inside"));
  EXPECT_TRUE(std::filesystem::exists(out / "after/pytorch_model.bin"));
}

// With the update during backward (ZeRO-Offload's overlap_step), a boundary backward inside a
// scope would begin a step that step() could not finish until the scope ends, and the end of a
// modifier rank's scope would race with it: the backward is refused before anything starts.
TEST(Stage3Access, ABoundaryBackwardThatWouldStepInsideAScopeIsRefused) {
  auto config = dstest::stage3_test_config(3);
  config["zero_optimization"]["offload_param"] = {{"device", "cpu"}};
  config["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}, {"overlap_step", true}};
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto model = std::make_shared<dstest::OuterModelImpl>();
    auto engine = dstest::engine_over(model, config, comm);
    auto b = dstest::token_batch(comm->rank(), 0);
    {
      auto scope = engine->gathered_parameters(/*modifier_rank=*/0);
      auto loss = engine->forward(b.idx, b.targets);
      const std::string refused =
          dstest::message_of<deepspeed::Error>([&] { engine->backward(loss); });
      EXPECT_CONTAINS(refused, "inside a gathered_parameters scope on rank " +
                                   std::to_string(comm->rank()));
      EXPECT_CONTAINS(refused, "overlap_step");
    }
    engine->backward(engine->forward(b.idx, b.targets));
    engine->step();
    EXPECT_TRUE(std::isfinite(engine->last_loss()));
  });
}

TEST(Stage3Access, GatheredParametersKeepTheModifierRanksEdits) {
  run_ranks(2, [](deepspeed::comm::CommunicatorPtr comm) {
    torch::manual_seed(3 + comm->rank());
    auto model = std::make_shared<ProbeModelImpl>();
    auto engine = dstest::engine_over(model, dstest::stage3_test_config(3), comm);
    auto& probe_w = model->probe->inner()->fc->weight;
    auto& mlp_w = model->mlp->inner()->fc->weight;
    torch::Tensor original;
    {
      auto scope = engine->gathered_parameters({model->probe});  // only the probe's unit
      ASSERT_EQ(probe_w.numel(), dstest::kWidth * dstest::kWidth);
      EXPECT_EQ(mlp_w.numel(), 0);
      original = probe_w.detach().clone();
      torch::NoGradGuard no_grad;
      probe_w.fill_(100.0 + comm->rank());  // every rank edits; no modifier: all dropped
    }
    EXPECT_EQ(probe_w.numel(), 0);
    {
      auto scope = engine->gathered_parameters(/*modifier_rank=*/1);
      EXPECT_TRUE(torch::equal(probe_w, original));
      EXPECT_EQ(mlp_w.numel(), 4 * dstest::kWidth * dstest::kWidth);
      torch::NoGradGuard no_grad;
      probe_w.fill_(100.0 + comm->rank());
      model->embed->weight.fill_(7.0 + comm->rank());  // root unit: rank 1's wins too
    }
    {
      auto scope = engine->gathered_parameters();
      EXPECT_TRUE(torch::equal(probe_w, torch::full_like(probe_w, 101.0)));
      EXPECT_TRUE(torch::equal(model->embed->weight, torch::full_like(model->embed->weight, 8.0)));
    }
    // consolidated_state_dict: everything, whole, on rank 0 only.
    auto dict = engine->consolidated_state_dict();
    if (comm->rank() != 0) {
      EXPECT_TRUE(dict.empty());
      return;
    }
    auto names = model->named_parameters();
    ASSERT_EQ(dict.size(), names.size() + model->named_buffers().size());
    EXPECT_EQ(dict[0].first, names.begin()->key());
    for (auto& [name, value] : dict)
      if (name == "probe.fc.weight") EXPECT_TRUE(torch::equal(value, torch::full_like(value, 101.0)));
    for (size_t i = 0; i < names.size(); ++i) EXPECT_GT(dict[i].second.numel(), 0) << dict[i].first;
  });
}

namespace {
// One rank's model and the engine over it.
template <class Model>
struct RankEngine {
  std::shared_ptr<Model> model;
  std::shared_ptr<deepspeed::ModelEngine<Model>> engine;
};

// Rank `comm`'s bf16 stage-3 engine over an OuterModel drawn from seed 7 on every rank.
RankEngine<dstest::OuterModelImpl> bf16_outer_engine(deepspeed::comm::CommunicatorPtr comm) {
  static std::mutex init;  // ranks are threads sharing libtorch's global generator: seed and draw atomically
  std::shared_ptr<dstest::OuterModelImpl> model;
  {
    std::lock_guard<std::mutex> lock(init);
    torch::manual_seed(7);
    model = std::make_shared<dstest::OuterModelImpl>();
  }
  auto config = dstest::stage3_test_config(3);
  config["bf16"] = {{"enabled", true}};
  return {model, dstest::engine_over(model, config, std::move(comm))};
}

// A modifier rank's scope writes into the fp32 masters only what it changed: under bf16 an empty
// scope after every step leaves training exactly as without it (writing the whole 16-bit slice
// back would round every master to bf16, losing the updates smaller than a bf16 step).
TEST(Stage3Access, AnUneditedModifierScopeLeavesTheMastersAlone) {
  auto train = [](bool open_scopes) {
    std::vector<double> losses;
    run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
      auto engine = bf16_outer_engine(comm).engine;
      std::vector<double> mine;
      for (int64_t step = 0; step < 8; ++step) {
        auto b = dstest::token_batch(comm->rank(), step);
        engine->backward(engine->forward(b.idx, b.targets));
        engine->step();
        mine.push_back(engine->last_loss());
        if (open_scopes) {
          auto scope = engine->gathered_parameters(/*modifier_rank=*/0);  // edits nothing
        }
      }
      if (comm->rank() == 0) losses = mine;
    });
    return losses;
  };
  auto plain = train(false), scoped = train(true);
  ASSERT_EQ(plain.size(), 8u);
  EXPECT_EQ(scoped, plain);
}

// The elements a modifier rank changed do reach the bf16 run's masters, run by run (here three
// runs: rows of one weight): after a step they keep the edit (moved by one small update), and the
// rows between them their own values.
// The edited rows lie in rank 0's half: modifier 1 edits another rank's slice, modifier 0 its own
// (whose gathered buffer already holds the edits when the scope ends).
TEST(Stage3Access, AModifierRanksEditsReachTheBf16Masters) {
  for (int modifier : {1, 0}) {
    run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
      auto [model, engine] = bf16_outer_engine(comm);
      auto w = model->named_parameters()["layers.0.fc.weight"];
      const std::vector<int64_t> edited = {0, 2, 5};
      {
        auto scope = engine->gathered_parameters(modifier);
        torch::NoGradGuard no_grad;
        if (comm->rank() == modifier)
          for (int64_t row : edited) w[row].fill_(0.5);
      }
      auto b = dstest::token_batch(comm->rank(), 0);
      engine->backward(engine->forward(b.idx, b.targets));
      engine->step();
      auto whole = engine->gathered_parameters();
      for (int64_t row = 0; row < 6; ++row) {
        const double off = (w[row].to(torch::kFloat) - 0.5).abs().max().item<double>();
        if (std::find(edited.begin(), edited.end(), row) != edited.end())
          EXPECT_LT(off, 0.05) << "modifier " << modifier << ", row " << row
                               << ": the edit did not reach the masters";
        else
          EXPECT_GT(off, 0.1) << "row " << row << " was not edited";
      }
    });
  }
}

// Stage 3 with qwZ (every unit gathered as int8 blocks) over a probe model drawn from seed 5.
RankEngine<ProbeModelImpl> quantized_weights_engine(deepspeed::comm::CommunicatorPtr comm) {
  torch::manual_seed(5);
  auto model = std::make_shared<ProbeModelImpl>();
  auto config = dstest::base_config(dstest::kBatch, 1, 3);
  config["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
  config["zero_optimization"]["zero_quantized_weights"] = true;
  return {model, dstest::engine_over(model, config, std::move(comm))};
}
}  // namespace

// ZeRO++ qwZ gathers units as int8 blocks; a unit gathered that way (here: by a forward, kept for
// its backward under DeepSpeed's default reuse distance) is gathered again exactly when
// gathered_parameters pins it, so a modifier rank's scope shows, and writes back into the
// masters, the true values, not their int8 rounding.
TEST(Stage3Access, AModifierRankSeesExactValuesAfterAQuantizedForward) {
  run_ranks(2, [](deepspeed::comm::CommunicatorPtr comm) {
    auto [model, engine] = quantized_weights_engine(comm);
    auto& probe_w = model->probe->inner()->fc->weight;
    auto first = dstest::token_batch(comm->rank(), 0);  // records the units' order
    engine->backward(engine->forward(first.idx, first.targets));
    engine->step();
    torch::Tensor exact;
    {
      auto scope = engine->gathered_parameters({model->probe});
      exact = probe_w.detach().clone();
    }
    auto b = dstest::token_batch(comm->rank(), 1);
    auto loss = engine->forward(b.idx, b.targets);
    ASSERT_GT(storage_nbytes(probe_w), 0) << "the probe's unit is not kept for its backward";
    EXPECT_FALSE(torch::equal(probe_w, exact)) << "the forward's gather was not quantized";
    {
      auto scope = engine->gathered_parameters(/*modifier_rank=*/1);
      EXPECT_TRUE(torch::equal(probe_w, exact));
    }
    {
      auto scope = engine->gathered_parameters({model->probe});
      EXPECT_TRUE(torch::equal(probe_w, exact)) << "the masters took the int8 rounding";
    }
  });
}

// The same when the pin comes while the unit is in use: a modifier-rank scope opened inside the
// unit's own (quantized) forward shows and writes back the exact values, and the backward that
// follows still runs.
TEST(Stage3Access, AModifierRankInsideAQuantizedForwardWritesExactValues) {
  run_ranks(2, [](deepspeed::comm::CommunicatorPtr comm) {
    const auto run = quantized_weights_engine(comm);
    const auto& model = run.model;  // named, not bound: the lambda below captures them
    const auto& engine = run.engine;
    auto& probe_w = model->probe->inner()->fc->weight;
    torch::Tensor exact, quantized, inside;
    {
      auto scope = engine->gathered_parameters({model->probe});
      exact = probe_w.detach().clone();
    }
    // In elements: the byte counts also hold qwZ's wire forms, whose earlier peak could hide it.
    int64_t gathered_before = 0, peak_after = 0, probe_numel = 0;
    model->probe->inner()->during_forward = [&] {
      quantized = probe_w.detach().clone();
      gathered_before = engine->memory_report().gathered_numel;
      probe_numel = probe_w.numel() + model->probe->inner()->fc->bias.numel();
      auto scope = engine->gathered_parameters({model->probe}, /*modifier_rank=*/1);
      inside = probe_w.detach().clone();
      peak_after = engine->memory_report().peak_gathered_numel;
    };
    auto b = dstest::token_batch(comm->rank(), 0);
    auto loss = engine->forward(b.idx, b.targets);
    model->probe->inner()->during_forward = nullptr;
    EXPECT_FALSE(torch::equal(quantized, exact)) << "the forward's gather was not quantized";
    EXPECT_TRUE(torch::equal(inside, exact)) << "the scope showed the int8 rounding";
    EXPECT_GE(peak_after, gathered_before + probe_numel)
        << "the exact gather ran while the parameters still held the quantized buffer: both count";
    engine->backward(loss);
    EXPECT_TRUE(std::isfinite(loss.item<double>()));
    {
      auto scope = engine->gathered_parameters({model->probe});
      EXPECT_TRUE(torch::equal(probe_w, exact)) << "the masters took the int8 rounding";
    }
  });
}

TEST(Stage3Init, UnitsArePartitionedAsTheyAreBuilt) {
  run_ranks(2, [](deepspeed::comm::CommunicatorPtr comm) {
    std::shared_ptr<gpt::GPTImpl> model;
    {
      deepspeed::zero::Init init(comm);
      model = std::make_shared<gpt::GPTImpl>(gpt::GPTConfig{256, 16, 2, 2, 32});
    }
    auto params = model->named_parameters();
    EXPECT_EQ(params["block0.attn.qkv.weight"].numel(), 0);
    EXPECT_EQ(params["block1.mlp.fc.bias"].numel(), 0);
    EXPECT_EQ(params["wte.weight"].numel(), 256 * 32);  // outside every unit: whole
    auto engine = dstest::engine_over(model, dstest::base_config(2, 1, 3), comm);
    auto whole = engine->gathered_parameters();
    EXPECT_EQ(params["block0.attn.qkv.weight"].sizes(), (std::vector<int64_t>{96, 32}));
  });
}

namespace {
// An embedding, one unit (an Mlp, 8352 elements: 4176 per rank of 2) and a head, every value
// `value`: built under zero::Init with a different value on each rank.
struct RankValuedModelImpl : torch::nn::Module {
  explicit RankValuedModelImpl(float value) {
    torch::NoGradGuard no_grad;
    embed = register_module("embed", torch::nn::Embedding(dstest::kVocab, dstest::kWidth));
    dstest::Mlp inner;
    for (auto& p : inner->parameters()) p.fill_(value);  // before the unit partitions it
    mlp = register_module("mlp", std::make_shared<ZeroUnit<dstest::Mlp>>(inner));
    head = register_module("head", torch::nn::Linear(dstest::kWidth, dstest::kVocab));
    for (auto& p : embed->parameters()) p.fill_(value);
    for (auto& p : head->parameters()) p.fill_(value);
  }
  torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets) {
    auto logits = deepspeed::zero::linear(mlp->forward(embed->forward(idx)), head->weight, head->bias);
    return torch::nn::functional::cross_entropy(logits.reshape({-1, dstest::kVocab}),
                                                targets.reshape({-1}));
  }
  torch::nn::Embedding embed{nullptr};
  std::shared_ptr<ZeroUnit<dstest::Mlp>> mlp;
  torch::nn::Linear head{nullptr};
};
}  // namespace

// zero::Init broadcasts rank 0's values of each unit before the ranks keep their slices: every
// rank builds its model with its own value (rank + 1), and after initialize() every element of
// the gathered model is rank 0's, 1. Without that broadcast each rank would keep a slice of its
// own model: the gathered unit would be rank 0's half 1 and rank 1's half 2 (initialize()'s own
// broadcast runs while the units are released, so it cannot repair them).
TEST(Stage3Init, EveryRankGetsRankZerosValues) {
  run_ranks(2, [](deepspeed::comm::CommunicatorPtr comm) {
    std::shared_ptr<RankValuedModelImpl> model;
    {
      deepspeed::zero::Init init(comm);
      model = std::make_shared<RankValuedModelImpl>(static_cast<float>(comm->rank() + 1));
    }
    ASSERT_EQ(model->mlp->inner()->fc->weight.numel(), 0);  // partitioned as built
    auto engine = dstest::engine_over(model, dstest::stage3_test_config(3), comm);
    auto whole = engine->gathered_parameters();
    for (auto& kv : model->named_parameters()) {
      const at::Tensor& p = kv.value();
      ASSERT_GT(p.numel(), 0) << kv.key();
      EXPECT_EQ(p.min().item<float>(), 1.0f) << kv.key() << " on rank " << comm->rank();
      EXPECT_EQ(p.max().item<float>(), 1.0f) << kv.key() << " on rank " << comm->rank();
    }
  });
}

// Init(comm, enabled, dtype): the slices are kept in the training dtype (half the bytes of fp32
// until initialize()), and the bf16 engine's weights are exactly those slices put together.
TEST(Stage3Init, SlicesKeptInTheTrainingDtype) {
  run_ranks(2, [](deepspeed::comm::CommunicatorPtr comm) {
    auto config = dstest::base_config(2, 1, 3);
    config["bf16"] = {{"enabled", true}};
    std::shared_ptr<gpt::GPTImpl> model;
    {
      deepspeed::zero::Init init(comm, true, torch::kBFloat16);
      model = std::make_shared<gpt::GPTImpl>(gpt::GPTConfig{256, 16, 2, 2, 32});
    }
    // Every rank's slices of each unit, gathered before initialize() adopts them.
    std::vector<std::pair<deepspeed::ZeroUnitBase*, at::Tensor>> units;
    for (auto& kv : model->named_modules())
      if (auto* unit = dynamic_cast<deepspeed::ZeroUnitBase*>(kv.value().get())) {
        const auto* shard = deepspeed::zero::init_shard(*unit);
        if (!shard) throw std::runtime_error(kv.key() + ": no zero::Init shard");
        const at::Tensor& slice = shard->slice;
        EXPECT_EQ(slice.scalar_type(), torch::kBFloat16) << kv.key();
        at::Tensor all = torch::empty({2 * slice.numel()}, slice.options());
        comm->all_gather(all, slice)->wait();
        units.emplace_back(unit, all);
      }
    ASSERT_FALSE(units.empty());
    auto engine = dstest::engine_over(model, config, comm);
    auto whole = engine->gathered_parameters();
    for (auto& [unit, all] : units) {
      std::vector<at::Tensor> flat;
      for (auto& p : unit->parameters()) flat.push_back(p.detach().reshape({-1}));
      at::Tensor weights = torch::cat(flat);
      EXPECT_EQ(weights.scalar_type(), torch::kBFloat16);
      EXPECT_TRUE(torch::equal(weights, all.narrow(0, 0, weights.numel())));
    }
  });
}

// Model states: 16Ψ/N in fp32 (4Ψ/N parameters doubling as master, 4Ψ/N gradients, 8Ψ/N moments).
TEST(Stage3Memory, ModelStatesAreSixteenPsiOverN) {
  for (int world : {1, 2, 4}) {
    const dstest::RunSpec s = partitioned_run(world, 2);
    auto r = dstest::train_gpt(s);
    const double psi = static_cast<double>(dstest::count_parameters(s.model));
    for (int rank = 0; rank < world; ++rank) {
      const auto& m = r.memory[rank];
      EXPECT_NEAR(m.model_states(), 16 * psi / world, 0.05 * 16 * psi / world)
          << "world " << world << ": params " << m.parameters << " grads " << m.gradients
          << " optimizer " << m.optimizer_states;
      EXPECT_EQ(m.gathered_numel, 0);  // between steps only the root unit is gathered
    }
  }
}

// A stage-3 engine releases its units' parameters; when it is destroyed their slices go with it.
// A second engine over the same model is refused naming an empty parameter (it used to partition
// the empty tensors and fail later, in forward or load_checkpoint, far from the cause).
TEST(Stage3Init, ASecondEngineOverAModelAnEndedEngineReleasedIsRefused) {
  run_ranks(2, [](deepspeed::comm::CommunicatorPtr comm) {
    auto model = std::make_shared<gpt::GPTImpl>(gpt::GPTConfig{256, 16, 2, 2, 32});
    auto config = dstest::base_config(2, 1, 3);
    config["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
    dstest::engine_over(model, config, comm).reset();  // built and destroyed
    const std::string msg = dstest::message_of<deepspeed::ConfigError>(
        [&] { dstest::engine_over(model, config, comm); });
    EXPECT_CONTAINS(msg, "parameter 'block0.");
    EXPECT_CONTAINS(msg, "a stage-3 engine that has been destroyed partitioned this model");
    // A model built again trains.
    model = std::make_shared<gpt::GPTImpl>(gpt::GPTConfig{256, 16, 2, 2, 32});
    auto engine = dstest::engine_over(model, config, comm);
    auto idx = torch::randint(256, {2, 16}, torch::kLong);
    engine->backward(engine->forward(idx, idx));
    engine->step();
  });
}

// Units nested in a LayerList: the consolidated dict has every name, in named_parameters() order,
// with the values the whole-model scope shows.
TEST(Stage3Access, ConsolidatedStateDictWalksIntoContainers) {
  run_ranks(3, [](deepspeed::comm::CommunicatorPtr comm) {
    torch::manual_seed(9);
    auto model = std::make_shared<dstest::OuterModelImpl>();
    auto engine = dstest::engine_over(model, dstest::stage3_test_config(3), comm);
    auto b = dstest::token_batch(comm->rank(), 0);
    engine->backward(engine->forward(b.idx, b.targets));
    engine->step();
    auto dict = engine->consolidated_state_dict();
    auto whole = engine->gathered_parameters();
    if (comm->rank() != 0) return;
    auto names = model->named_parameters();
    ASSERT_EQ(dict.size(), names.size());
    size_t i = 0;
    for (auto& kv : names) {
      EXPECT_EQ(dict[i].first, kv.key());
      EXPECT_TRUE(torch::equal(dict[i].second, kv.value())) << kv.key();
      ++i;
    }
  });
}

}  // namespace zero_stage3_lifecycle_test
