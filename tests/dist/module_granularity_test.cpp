// stage3_module_granularity_threshold on an engine (2 ranks as threads): ZeroUnits nested in a
// leaf module are gathered with the unit around them, so a model wrapped finely trains exactly as
// the same model wrapped by hand at block level, with as many all-gathers; also when zero::Init
// partitioned the nested units as they were built.
#include <gtest/gtest.h>

#include <mutex>
#include <optional>
#include <string>

#include "deepspeed/zero_init.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/ranks.h"
#include "support/stage3_models.h"
#include "support/training_run.h"

namespace module_granularity_test {

namespace {
using deepspeed::ZeroUnit;
using dstest::kVocab;
using dstest::kWidth;
using dstest::Mlp;

constexpr int kWorld = 2, kSteps = 4;

// Each parameter from its own generator, in construction order: the ranks (threads) build the
// same values without the global RNG, also under zero::Init, which partitions a unit as it is
// built (so the values are drawn before any unit wraps them).
void draw(torch::nn::Module& m, uint64_t& seed) {
  torch::NoGradGuard no_grad;
  for (auto& p : m.parameters())
    p.copy_(torch::randn(p.sizes(), at::make_generator<at::CPUGeneratorImpl>(seed++)) * 0.1);
}

// A LayerNorm, then two Mlps: nested units (wrapped finely, as DeepSpeed hooks every module) or
// plain modules (wrapped by hand at block level). Same parameters, names and order either way.
struct BlockImpl : torch::nn::Module {
  BlockImpl(bool nested, uint64_t& seed) {
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kWidth})));
    Mlp first, second;
    draw(*first, seed);
    draw(*second, seed);
    if (nested) {
      attn_unit = register_module("attn", std::make_shared<ZeroUnit<Mlp>>(first));
      mlp_unit = register_module("mlp", std::make_shared<ZeroUnit<Mlp>>(second));
    } else {
      attn = register_module("attn", first);
      mlp = register_module("mlp", second);
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto y = ln(x);
    y = attn_unit ? attn_unit->forward(y) : attn(y);
    return mlp_unit ? mlp_unit->forward(y) : mlp(y);
  }
  torch::nn::LayerNorm ln{nullptr};
  Mlp attn{nullptr}, mlp{nullptr};
  std::shared_ptr<ZeroUnit<Mlp>> attn_unit, mlp_unit;
};
TORCH_MODULE(Block);

struct ModelImpl : torch::nn::Module {
  explicit ModelImpl(bool nested) {
    uint64_t seed = 7;
    embed = register_module("embed", torch::nn::Embedding(kVocab, kWidth));
    draw(*embed, seed);
    for (int i = 0; i < 2; ++i)
      blocks.push_back(register_module("block" + std::to_string(i),
                                       std::make_shared<ZeroUnit<Block>>(Block(nested, seed))));
    head = register_module("head", torch::nn::Linear(kWidth, kVocab));
    draw(*head, seed);
  }
  torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets) {
    auto x = embed(idx);
    for (auto& b : blocks) x = b->forward(x);
    auto logits = deepspeed::zero::linear(x, head->weight, head->bias);
    return torch::nn::functional::cross_entropy(logits.reshape({-1, kVocab}),
                                                targets.reshape({-1}));
  }
  torch::nn::Embedding embed{nullptr};
  std::vector<std::shared_ptr<ZeroUnit<Block>>> blocks;
  torch::nn::Linear head{nullptr};
};

struct TrainingRun {
  std::vector<double> losses;
  std::vector<torch::Tensor> weights;  // rank 0's, gathered
  int64_t gathers = 0;                 // rank 0's all-gathers during training
};

// Above every module's granularity (the blocks' is (64 + 2 x 8352) / 8 = 2096): the model is the
// leaf; its outermost units, the blocks, stay units and the Mlps in them fold into them.
constexpr int64_t kFoldAll = 100000;

// `resume`: train the first `resume->at` steps at `resume->threshold`, save, and go on in a new
// engine at `threshold` from that checkpoint.
struct Resume {
  int64_t threshold;
  int at;
  std::string dir;
};

TrainingRun train(bool nested, int64_t threshold, bool under_init = false,
                  const std::optional<Resume>& resume = std::nullopt,
                  const nlohmann::json& zero_patch = nlohmann::json::object()) {
  auto config = dstest::stage3_test_config(3);
  config["zero_optimization"]["stage3_module_granularity_threshold"] = threshold;
  config["zero_optimization"].merge_patch(zero_patch);
  TrainingRun run;
  std::mutex mu;
  run_ranks(kWorld, [&](deepspeed::comm::CommunicatorPtr comm) {
    std::shared_ptr<ModelImpl> model;
    {
      deepspeed::zero::Init init(comm, under_init);
      model = std::make_shared<ModelImpl>(nested);
    }
    std::vector<double> losses;
    int64_t first = 0;
    if (resume) {
      auto before = config;
      before["zero_optimization"]["stage3_module_granularity_threshold"] = resume->threshold;
      auto engine = dstest::engine_over(model, before, comm);
      for (; first < resume->at; ++first) {
        auto b = dstest::token_batch(comm->rank(), first);
        engine->backward(engine->forward(b.idx, b.targets));
        engine->step();
        losses.push_back(engine->last_loss());
      }
      engine->save_checkpoint(resume->dir);
      // A released unit cannot be partitioned again by another engine: a new model, whose
      // values load_checkpoint replaces.
      deepspeed::zero::Init init(comm, under_init);
      model = std::make_shared<ModelImpl>(nested);
    }
    auto engine = dstest::engine_over(model, config, comm);
    if (resume) engine->load_checkpoint(resume->dir);
    engine->communicator()->reset_stats();
    for (int64_t step = first; step < kSteps; ++step) {
      auto b = dstest::token_batch(comm->rank(), step);
      engine->backward(engine->forward(b.idx, b.targets));
      engine->step();
      losses.push_back(engine->last_loss());
    }
    int64_t gathers = 0;
    for (const auto& [op, st] : engine->communicator()->stats())
      if (op.rfind("all_gather", 0) == 0) gathers += st.calls;
    auto whole = engine->gathered_parameters();
    std::lock_guard<std::mutex> lock(mu);
    if (comm->rank() != 0) return;
    run.losses = losses;
    run.gathers = gathers;
    for (auto& p : model->parameters()) run.weights.push_back(p.detach().clone());
  });
  return run;
}
}  // namespace

TEST(ModuleGranularity, FoldedUnitsTrainAsTheModelWrappedByHand) {
  const TrainingRun fine = train(/*nested=*/true, 0);
  const TrainingRun folded = train(/*nested=*/true, kFoldAll);
  const TrainingRun by_hand = train(/*nested=*/false, 0);
  std::cout << "rank 0's all-gathers over " << kSteps << " steps: " << fine.gathers
            << " with every unit on its own, " << folded.gathers << " folded, " << by_hand.gathers
            << " wrapped by hand\n";
  // The same layout as the hand-wrapped model: the same arithmetic, bit for bit.
  EXPECT_EQ(folded.losses, by_hand.losses);
  EXPECT_TRUE(dstest::bit_identical(folded.weights, by_hand.weights));
  EXPECT_EQ(folded.gathers, by_hand.gathers);
  // Each block's two Mlps were gathered on their own, forward and backward, every step.
  EXPECT_EQ(fine.gathers, folded.gathers + 2 * 2 * 2 * kSteps);
  ASSERT_EQ(fine.losses.size(), folded.losses.size());
  for (size_t i = 0; i < fine.losses.size(); ++i)
    EXPECT_NEAR(fine.losses[i], folded.losses[i], 1e-6 * std::abs(fine.losses[i]));
}

// zero_optimization.leaf_module names the blocks (by the type the units wrap, or by name): the
// same folding as the threshold's.
TEST(ModuleGranularity, LeafModulesNamedInTheConfigFoldAsTheThresholdDoes) {
  const TrainingRun by_hand = train(/*nested=*/false, 0);
  const TrainingRun by_type =
      train(/*nested=*/true, 0, false, std::nullopt, {{"leaf_module", {{"classes", {"Block"}}}}});
  const TrainingRun by_name = train(/*nested=*/true, 0, false, std::nullopt,
                                    {{"leaf_module", {{"names", {"block0", "block1"}}}}});
  for (const TrainingRun* run : {&by_type, &by_name}) {
    EXPECT_EQ(run->losses, by_hand.losses);
    EXPECT_TRUE(dstest::bit_identical(run->weights, by_hand.weights));
    EXPECT_EQ(run->gathers, by_hand.gathers);
  }
}

TEST(ModuleGranularity, BelowEveryGranularityEveryUnitStays) {
  const TrainingRun fine = train(/*nested=*/true, 0);
  const TrainingRun low = train(/*nested=*/true, 10);  // below every module's granularity
  EXPECT_EQ(low.gathers, fine.gathers);
  EXPECT_EQ(low.losses, fine.losses);
}

TEST(ModuleGranularity, UnitsPartitionedByZeroInitFoldFromTheirSlices) {
  // Built under zero::Init, the nested Mlps hold only their slices until initialize(): their
  // granularity is counted from the recorded shapes, and their slices are gathered with the
  // block that takes them in.
  const TrainingRun folded = train(/*nested=*/true, kFoldAll);
  const TrainingRun init = train(/*nested=*/true, kFoldAll, /*under_init=*/true);
  EXPECT_EQ(init.gathers, folded.gathers);
  EXPECT_EQ(init.losses, folded.losses);
  EXPECT_TRUE(dstest::bit_identical(init.weights, folded.weights));
}

TEST(ModuleGranularity, ACheckpointResumesUnderAnotherThreshold) {
  // Saved with every unit on its own, resumed with the Mlps folded into their blocks (and back):
  // the checkpoint's per-element fragments load into either layout, and training goes on as the
  // uninterrupted run's (which gathers differently but computes the same).
  const TrainingRun fine = train(/*nested=*/true, 0);
  dstest::TempDir dir_a, dir_b;
  const TrainingRun to_folded = train(/*nested=*/true, kFoldAll, false, Resume{0, 2, dir_a.path()});
  const TrainingRun to_fine = train(/*nested=*/true, 0, false, Resume{kFoldAll, 2, dir_b.path()});
  ASSERT_EQ(to_folded.losses.size(), fine.losses.size());
  for (size_t i = 0; i < fine.losses.size(); ++i) {
    EXPECT_NEAR(to_folded.losses[i], fine.losses[i], 1e-6 * std::abs(fine.losses[i])) << i;
    EXPECT_NEAR(to_fine.losses[i], fine.losses[i], 1e-6 * std::abs(fine.losses[i])) << i;
  }
}

}  // namespace module_granularity_test
