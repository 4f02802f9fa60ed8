// ZeRO-3 with many small units (every Linear its own ZeroUnit, as DeepSpeed hooks every module)
// against the same model with stage3_module_granularity_threshold folding them into their blocks,
// the blocks wrapped by hand, and ZeRO-2 on the block-wrapped model: step time and all-gathers.
// A GPT (learned positions, pre-LayerNorm blocks, causal attention, GELU MLP, untied head),
// AdamW, bf16 or fp32; stage 3 partitions every parameter (persistence threshold 0) and releases
// each unit after use (reuse distance 0), as in a model too large to keep gathered.
// Run under the launcher, one thread per rank:
//   OMP_NUM_THREADS=1 build/bin/dsrun --num_procs 2 --no_local_rank \
//       build/bin/bench_module_granularity \
//       [layers=8] [width=128] [steps=10] [rounds=3] [dtype=fp32] [threshold=100000]
// Each round runs every variant (a new model and engine, 2 untimed steps, then `steps` timed),
// in a rotated order; rank 0 prints each variant's median round and the rounds.
#include <fmt/core.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench_args.h"
#include "deepspeed/deepspeed.h"
#include "deepspeed/zero_unit.h"
#include "gpt/model.h"
#include "zero/stage3/unit_granularity.h"

namespace {
constexpr int64_t kVocab = 256, kContext = 64, kMicroBatch = 4, kHeads = 4;

// y = x W^T + b through zero::linear (saves W itself: a released unit's storage is really freed).
struct ZLinearImpl : torch::nn::Module {
  ZLinearImpl(int64_t in, int64_t out) {
    weight = register_parameter("weight", torch::randn({out, in}) * 0.02);
    bias = register_parameter("bias", torch::zeros({out}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return deepspeed::zero::linear(x, weight, bias); }
  torch::Tensor weight, bias;
};
TORCH_MODULE(ZLinear);

// A Linear that is its own ZeroUnit (fine) or a plain module of the block (coarse).
std::function<torch::Tensor(const torch::Tensor&)> linear(torch::nn::Module& owner,
                                                          const std::string& name, int64_t in,
                                                          int64_t out, bool fine) {
  if (fine) {
    auto unit = owner.register_module(
        name, std::make_shared<deepspeed::ZeroUnit<ZLinear>>(ZLinear(in, out)));
    return [unit](const torch::Tensor& x) { return unit->forward(x); };
  }
  auto plain = owner.register_module(name, ZLinear(in, out));
  return [plain](const torch::Tensor& x) { return plain->forward(x); };
}

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t width, bool fine) : width_(width) {
    ln1 = register_module("ln1", gpt::LayerNorm(torch::nn::LayerNormOptions({width})));
    qkv = linear(*this, "qkv", width, 3 * width, fine);
    proj = linear(*this, "proj", width, width, fine);
    ln2 = register_module("ln2", gpt::LayerNorm(torch::nn::LayerNormOptions({width})));
    fc = linear(*this, "fc", width, 4 * width, fine);
    out = linear(*this, "out", 4 * width, width, fine);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t B = x.size(0), T = x.size(1), hd = width_ / kHeads;
    auto parts = qkv(ln1(x)).split(width_, -1);
    auto heads = [&](const torch::Tensor& t) { return t.view({B, T, kHeads, hd}).transpose(1, 2); };
    auto q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
    auto att = q.matmul(k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
    auto mask = torch::ones({T, T}, torch::kBool).triu(1);
    att = torch::softmax(att.masked_fill(mask, -1e9), -1);
    auto y = att.matmul(v).transpose(1, 2).reshape({B, T, width_});
    auto h = x + proj(y);
    return h + out(torch::gelu(fc(ln2(h))));
  }
  int64_t width_;
  gpt::LayerNorm ln1{nullptr}, ln2{nullptr};
  std::function<torch::Tensor(const torch::Tensor&)> qkv, proj, fc, out;
};
TORCH_MODULE(Block);

struct ModelImpl : torch::nn::Module {
  ModelImpl(int64_t layers, int64_t width, bool fine) {
    wte = register_module("wte", torch::nn::Embedding(kVocab, width));
    wpe = register_module("wpe", torch::nn::Embedding(kContext, width));
    for (int64_t i = 0; i < layers; ++i)
      blocks.push_back(
          register_module("block" + std::to_string(i),
                          std::make_shared<deepspeed::ZeroUnit<Block>>(Block(width, fine))));
    ln_f = register_module("ln_f", gpt::LayerNorm(torch::nn::LayerNormOptions({width})));
    head = register_module("head", ZLinear(width, kVocab));
  }
  torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets) {
    auto x = wte(idx) + wpe(torch::arange(idx.size(1)));
    for (auto& b : blocks) x = b->forward(x);
    auto logits = head(ln_f(x));
    return torch::nn::functional::cross_entropy(logits.reshape({-1, kVocab}),
                                                targets.reshape({-1}));
  }
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  std::vector<std::shared_ptr<deepspeed::ZeroUnit<Block>>> blocks;
  gpt::LayerNorm ln_f{nullptr};
  ZLinear head{nullptr};
};

struct Variant {
  std::string name;
  int stage;
  bool fine;
  bool fold;
};

struct Measured {
  double ms_per_step = 0, gathers_per_step = 0, loss = 0;
  size_t units = 0;
};

Measured run(const Variant& v, int64_t layers, int64_t width, int steps, bool bf16,
             int64_t threshold, const deepspeed::comm::CommunicatorPtr& comm) {
  torch::manual_seed(1234);
  auto model = std::make_shared<ModelImpl>(layers, width, v.fine);
  nlohmann::json config = {
      {"train_micro_batch_size_per_gpu", kMicroBatch},
      {"gradient_accumulation_steps", 1},
      {"steps_per_print", 1000000},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-4}, {"weight_decay", 0.01}}}}},
      {"bf16", {{"enabled", bf16}}},
      {"zero_optimization",
       {{"stage", v.stage},
        {"stage3_param_persistence_threshold", 0},
        {"stage3_max_reuse_distance", 0},
        {"stage3_module_granularity_threshold", v.fold ? threshold : 0}}}};
  Measured m;
  m.units = deepspeed::zero::choose_fetch_units(*model, v.fold ? threshold : 0).units.size();
  auto engine =
      deepspeed::initialize<ModelImpl>({.model = model, .config_json = config, .comm = comm})
          .engine;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(99 + comm->rank());
  auto one_step = [&] {
    auto idx = torch::randint(kVocab, {kMicroBatch, kContext}, gen, torch::kLong);
    engine->backward(engine->forward(idx, (idx * 5 + 3) % kVocab));
    engine->step();
  };
  one_step();
  one_step();
  auto gathers = [&] {
    int64_t n = 0;
    for (const auto& [op, st] : comm->stats())
      if (op.rfind("all_gather", 0) == 0) n += st.calls;
    return n;
  };
  comm->barrier();
  const int64_t g0 = gathers();
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) one_step();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  m.ms_per_step = 1000 * seconds / steps;
  m.gathers_per_step = static_cast<double>(gathers() - g0) / steps;
  m.loss = engine->last_loss();
  return m;
}
}  // namespace

int main(int argc, char** argv) try {
  const BenchArgs args(argc, argv,
                       "Usage: bench_module_granularity [layers=8] [width=128] [steps=10] "
                       "[rounds=3] [dtype=fp32] [threshold=100000]");
  args.at_most(6);
  const int64_t layers = args.number(1, 8), width = args.number(2, 128);
  const int steps = static_cast<int>(args.number(3, 10)),
            rounds = static_cast<int>(args.number(4, 3));
  const std::string dtype = args.text(5, "fp32");
  const int64_t threshold = args.number(6, 100000);
  if (dtype != "bf16" && dtype != "fp32")
    args.fail("dtype '" + dtype + "' is neither bf16 nor fp32");
  if (layers < 1 || width < kHeads || width % kHeads || steps < 1 || rounds < 1 || threshold < 1)
    args.fail("layers, steps, rounds and threshold must be positive, width a multiple of 4");
  at::set_num_threads(1);
  auto comm = deepspeed::init_distributed();
  const std::vector<Variant> variants = {
      {"ZeRO-2, blocks wrapped by hand", 2, false, false},
      {"ZeRO-3, blocks wrapped by hand", 3, false, false},
      {"ZeRO-3, every Linear a unit", 3, true, false},
      {"ZeRO-3, every Linear a unit, threshold " + std::to_string(threshold), 3, true, true},
  };
  std::vector<std::vector<Measured>> got(variants.size());
  for (int r = 0; r < rounds; ++r)
    for (size_t k = 0; k < variants.size(); ++k) {
      const size_t i = (k + r) % variants.size();  // rotated: no variant always runs first
      got[i].push_back(run(variants[i], layers, width, steps, dtype == "bf16", threshold, comm));
    }
  if (comm->rank() != 0) return 0;
  fmt::print(
      "{} ranks, {} layers, width {}, {} x {} tokens per rank, {}, {} timed steps x {} rounds\n\n",
      comm->world_size(), layers, width, kMicroBatch, kContext, dtype, steps, rounds);
  fmt::print(
      "| variant | units gathered on their own | all-gathers per step | step ms, median (rounds) | "
      "loss |\n");
  fmt::print("| --- | ---: | ---: | ---: | ---: |\n");
  for (size_t i = 0; i < variants.size(); ++i) {
    auto runs = got[i];
    std::vector<double> ms;
    for (const auto& m : runs) ms.push_back(m.ms_per_step);
    std::string all;
    for (double x : ms) all += (all.empty() ? "" : ", ") + fmt::format("{:.0f}", x);
    std::sort(ms.begin(), ms.end());
    fmt::print("| {} | {} | {:.0f} | {:.0f} ({}) | {:.4f} |\n", variants[i].name,
               variants[i].stage == 3 ? std::to_string(runs[0].units) : "-",
               runs[0].gathers_per_step, ms[ms.size() / 2], all, runs.back().loss);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_module_granularity: %s\n", e.what());
  return 1;
}
