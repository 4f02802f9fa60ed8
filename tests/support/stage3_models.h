// Small models that exercise ZeRO-3's unit rules, and a trainer for them over ranks as threads:
//   TiedModel:  a weight shared by two units (embedding and head): it joins the root unit;
//   RootTiedModel: a unit's weight (the head's) registered outside every unit too (the embedding):
//               it joins the root unit;
//   TwiceModel: one unit applied twice in one forward (its backward runs twice before it reduces);
//   OuterModel: a parameter outside every unit (root), the units in a LayerList.
// engine_over builds one rank's engine over any of them.
// Tokens: vocabulary kVocab, batches of kBatch x kTokens drawn per (rank, step).
#pragma once
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "deepspeed/engine.h"
#include "deepspeed/zero_unit.h"

namespace dstest {

constexpr int64_t kVocab = 64, kWidth = 32, kTokens = 8, kBatch = 4;

class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl();
  torch::Tensor forward(const torch::Tensor& x);  // x + proj(gelu(fc(x)))
  torch::nn::Linear fc{nullptr}, proj{nullptr};
};
TORCH_MODULE(Mlp);

class TiedHeadImpl : public torch::nn::Module {
 public:
  explicit TiedHeadImpl(torch::Tensor shared) { weight = register_parameter("weight", shared); }
  torch::Tensor forward(const torch::Tensor& x) { return deepspeed::zero::linear(x, weight); }
  torch::Tensor weight;
};
TORCH_MODULE(TiedHead);

class TiedModelImpl : public torch::nn::Module {
 public:
  TiedModelImpl();
  torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets);
  std::shared_ptr<deepspeed::ZeroUnit<torch::nn::Embedding>> embed;
  std::shared_ptr<deepspeed::ZeroUnit<Mlp>> body;
  std::shared_ptr<deepspeed::ZeroUnit<TiedHead>> head;
};

// The embedding outside every unit, the head a unit tied to it: the root reads the head's weight
// before the unit runs.
class RootTiedModelImpl : public torch::nn::Module {
 public:
  RootTiedModelImpl();
  torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets);
  torch::nn::Embedding embed{nullptr};
  std::shared_ptr<deepspeed::ZeroUnit<Mlp>> body;
  std::shared_ptr<deepspeed::ZeroUnit<TiedHead>> head;
};

class TwiceModelImpl : public torch::nn::Module {
 public:
  TwiceModelImpl();
  torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets);
  torch::nn::Embedding embed{nullptr};
  std::shared_ptr<deepspeed::ZeroUnit<Mlp>> block, other;
  torch::nn::Linear head{nullptr};
};

class OuterModelImpl : public torch::nn::Module {
 public:
  OuterModelImpl();
  torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets);
  torch::nn::Embedding embed{nullptr};
  deepspeed::LayerList layers{nullptr};
  torch::Tensor gain;  // outside every unit
  torch::nn::Linear head{nullptr};
};

struct Batch {
  torch::Tensor idx, targets;
};
Batch token_batch(int rank, int64_t step);

struct ModelRun {
  std::vector<double> losses;
  std::vector<torch::Tensor> weights;  // rank 0's, gathered
  std::vector<deepspeed::MemoryReport> memory;
};

// Builds one model per rank (rank 0 from seed 11, the others from other seeds: initialize()
// broadcasts rank 0's) and trains `steps` optimizer steps.
template <class Model>
ModelRun train_model(int world, const nlohmann::json& config, int steps);

// The base config (AdamW, micro batch kBatch) at `stage`; stage 3 partitions every parameter
// (persistence threshold 0) and releases a unit as soon as it is done (reuse distance 0).
nlohmann::json stage3_test_config(int stage, int accumulation = 1);

// Rank `comm`'s engine over `model` under `config` (ranks as threads; no training data).
template <class Model>
std::shared_ptr<deepspeed::ModelEngine<Model>> engine_over(std::shared_ptr<Model> model,
                                                           const nlohmann::json& config,
                                                           deepspeed::comm::CommunicatorPtr comm) {
  return deepspeed::initialize<Model>(
             {.model = std::move(model), .config_json = config, .comm = std::move(comm)})
      .engine;
}

}  // namespace dstest
