#include "support/stage3_models.h"

#include <mutex>

#include <ATen/CPUGeneratorImpl.h>

#include "support/ranks.h"
#include "support/training_run.h"

namespace dstest {
namespace F = torch::nn::functional;
using deepspeed::ZeroUnit;

namespace {
torch::Tensor lin(const torch::nn::Linear& l, const torch::Tensor& x) {
  return deepspeed::zero::linear(x, l->weight, l->bias);
}
torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  return F::cross_entropy(logits.reshape({-1, kVocab}), targets.reshape({-1}));
}
}  // namespace

MlpImpl::MlpImpl() {
  fc = register_module("fc", torch::nn::Linear(kWidth, 4 * kWidth));
  proj = register_module("proj", torch::nn::Linear(4 * kWidth, kWidth));
}
torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  return x + lin(proj, torch::gelu(lin(fc, x)));
}

TiedModelImpl::TiedModelImpl() {
  embed = register_module("embed", std::make_shared<ZeroUnit<torch::nn::Embedding>>(
                                       torch::nn::Embedding(kVocab, kWidth)));
  body = register_module("body", std::make_shared<ZeroUnit<Mlp>>(Mlp()));
  head = register_module("head", std::make_shared<ZeroUnit<TiedHead>>(
                                     TiedHead(embed->inner()->weight)));
}
torch::Tensor TiedModelImpl::forward(const torch::Tensor& idx, const torch::Tensor& targets) {
  return cross_entropy(head->forward(body->forward(embed->forward(idx))), targets);
}

RootTiedModelImpl::RootTiedModelImpl() {
  embed = register_module("embed", torch::nn::Embedding(kVocab, kWidth));
  body = register_module("body", std::make_shared<ZeroUnit<Mlp>>(Mlp()));
  head = register_module("head", std::make_shared<ZeroUnit<TiedHead>>(TiedHead(embed->weight)));
}
torch::Tensor RootTiedModelImpl::forward(const torch::Tensor& idx, const torch::Tensor& targets) {
  return cross_entropy(head->forward(body->forward(embed->forward(idx))), targets);
}

TwiceModelImpl::TwiceModelImpl() {
  embed = register_module("embed", torch::nn::Embedding(kVocab, kWidth));
  block = register_module("block", std::make_shared<ZeroUnit<Mlp>>(Mlp()));
  other = register_module("other", std::make_shared<ZeroUnit<Mlp>>(Mlp()));
  head = register_module("head", torch::nn::Linear(kWidth, kVocab));
}
torch::Tensor TwiceModelImpl::forward(const torch::Tensor& idx, const torch::Tensor& targets) {
  auto x = block->forward(embed->forward(idx));
  x = block->forward(other->forward(x));
  return cross_entropy(lin(head, x), targets);
}

OuterModelImpl::OuterModelImpl() {
  embed = register_module("embed", torch::nn::Embedding(kVocab, kWidth));
  layers = register_module("layers", deepspeed::LayerList());
  for (int i = 0; i < 3; ++i) layers->push_back(Mlp());
  gain = register_parameter("gain", torch::ones({kWidth}) + 0.1 * torch::randn({kWidth}));
  head = register_module("head", torch::nn::Linear(kWidth, kVocab));
}
torch::Tensor OuterModelImpl::forward(const torch::Tensor& idx, const torch::Tensor& targets) {
  auto x = layers->forward(embed->forward(idx) * gain);
  return cross_entropy(lin(head, x * gain), targets);
}

Batch token_batch(int rank, int64_t step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 * step + rank + 1);
  auto opts = torch::TensorOptions().dtype(torch::kLong);
  auto idx = torch::randint(kVocab, {kBatch, kTokens}, gen, opts);
  return {idx, (idx * 5 + 3) % kVocab};  // a rule the models can learn
}

template <class Model>
ModelRun train_model(int world, const nlohmann::json& config, int steps) {
  at::set_num_threads(1);
  std::vector<std::shared_ptr<Model>> models;
  for (int r = 0; r < world; ++r) {
    torch::manual_seed(r == 0 ? 11 : 500 + r);
    models.push_back(std::make_shared<Model>());
  }
  ModelRun run;
  run.memory.resize(world);
  std::mutex mu;
  run_ranks(world, [&](deepspeed::comm::CommunicatorPtr comm) {
    const int rank = comm->rank();
    auto init = deepspeed::initialize<Model>({.model = models[rank], .config_json = config, .comm = comm});
    auto& engine = init.engine;
    std::vector<double> losses;
    for (int64_t micro = 0; engine->global_steps() < steps; ++micro) {
      auto b = token_batch(rank, micro);
      engine->backward(engine->forward(b.idx, b.targets));
      const bool boundary = engine->is_gradient_accumulation_boundary();
      engine->step();
      if (boundary) losses.push_back(engine->last_loss());
    }
    auto memory = engine->memory_report();
    auto whole = engine->gathered_parameters();
    std::lock_guard<std::mutex> lock(mu);
    run.memory[rank] = memory;
    if (rank == 0) {
      run.losses = losses;
      for (auto& p : models[0]->parameters()) run.weights.push_back(p.detach().clone());
    }
  });
  return run;
}

template ModelRun train_model<TiedModelImpl>(int, const nlohmann::json&, int);
template ModelRun train_model<RootTiedModelImpl>(int, const nlohmann::json&, int);
template ModelRun train_model<TwiceModelImpl>(int, const nlohmann::json&, int);
template ModelRun train_model<OuterModelImpl>(int, const nlohmann::json&, int);

nlohmann::json stage3_test_config(int stage, int accumulation) {
  auto c = base_config(kBatch, accumulation, stage);
  if (stage == 3) {
    c["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
    c["zero_optimization"]["stage3_max_reuse_distance"] = 0;
  }
  return c;
}

}  // namespace dstest
