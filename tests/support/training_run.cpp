#include "support/training_run.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "comm/nccl_communicator.h"
#include "deepspeed/comm.h"
#include "deepspeed/optimizer.h"
#include "deepspeed/zero_init.h"
#include "gpt/text_dataset.h"
#include "support/files.h"
#include "support/ranks.h"

namespace dstest {

nlohmann::json base_config(int micro_batch, int accumulation, int stage) {
  return {
      {"train_micro_batch_size_per_gpu", micro_batch},
      {"gradient_accumulation_steps", accumulation},
      {"steps_per_print", 0},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.01}}}}},
      {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 2000}, {"overlap_comm", true}}},
      {"seed", 99},
  };
}

std::shared_ptr<deepspeed::Dataset> test_text_dataset(int64_t block) {
  return std::make_shared<gpt::TextDataset>(source_dir() + "/data/fortunes.txt", block, block);
}

int64_t optimizer_state_bytes(const RunResult& result) {
  int64_t total = 0;
  for (const auto& m : result.memory) total += m.optimizer_states;
  return total;
}

RunResult train_gpt(const RunSpec& spec) {
  at::set_num_threads(1);
  // Models are built up front on this thread: the global RNG is not per-thread.
  std::vector<std::shared_ptr<gpt::GPTImpl>> models(spec.world_size);
  auto prepare = [&spec](gpt::GPTImpl& model) {
    torch::NoGradGuard no_grad;
    if (!spec.initial_weights.empty()) {
      auto params = model.parameters();
      TORCH_CHECK(params.size() == spec.initial_weights.size(), "initial_weights: wrong count");
      for (size_t i = 0; i < params.size(); ++i) params[i].copy_(spec.initial_weights[i]);
    }
    for (auto& name : spec.frozen) model.named_parameters()[name].set_requires_grad(false);
  };
  for (int r = 0; r < spec.world_size && !spec.zero_init; ++r) {
    torch::manual_seed(r == 0 ? spec.model_seed : spec.model_seed + 1000 + r);  // others differ: broadcast must fix them
    models[r] = std::make_shared<gpt::GPTImpl>(spec.model);
    prepare(*models[r]);
  }
  auto data = test_text_dataset(spec.model.block_size);
  RunResult result;
  result.memory.resize(spec.world_size);
  if (!spec.zero_init)
    for (auto& p : models[0]->parameters()) result.initial.push_back(p.detach().clone());
  std::mutex mu;
  auto body = [&](deepspeed::comm::CommunicatorPtr comm) {
    const int rank = comm->rank();
    if (spec.zero_init) {
      deepspeed::zero::Init init(comm);
      models[rank] = std::make_shared<gpt::GPTImpl>(spec.model);
      prepare(*models[rank]);
    }
    std::shared_ptr<torch::optim::Optimizer> client;
    if (spec.client_optimizer) client = spec.client_optimizer(*models[rank]);
    std::vector<deepspeed::ParamGroup> groups;
    if (spec.model_parameters) groups = spec.model_parameters(*models[rank]);
    auto [engine, optimizer, loader, scheduler] = deepspeed::initialize<gpt::GPTImpl>(
        {.model = models[rank],
         .config_json = spec.config,
         .training_data = data,
         .optimizer = client,
         .model_parameters = std::move(groups),
         .comm = comm,
         .device = spec.device});
    if (spec.before_training) spec.before_training(*engine);
    if (spec.zero_init) {
      auto whole = engine->gathered_parameters();
      std::lock_guard<std::mutex> lock(mu);
      if (rank == 0)
        for (auto& p : models[0]->parameters()) result.initial.push_back(p.detach().clone());
    }
    std::vector<double> losses, grad_norms;
    while (engine->global_steps() < spec.steps) {
      auto batch = loader->next();
      auto loss = engine->forward(batch.data, batch.target);
      engine->backward(loss);
      bool boundary = engine->is_gradient_accumulation_boundary();
      if (spec.step)
        spec.step(*engine);
      else
        engine->step();
      if (boundary) {
        losses.push_back(engine->last_loss());
        grad_norms.push_back(engine->get_global_grad_norm());
      }
    }
    if (spec.after_training) spec.after_training(*engine);
    auto memory = engine->memory_report();
    auto whole = engine->gathered_parameters();  // stage 3: the parameters are partitioned
    std::lock_guard<std::mutex> lock(mu);
    result.memory[rank] = memory;
    if (rank == 0) {
      result.losses = losses;
      result.grad_norms = grad_norms;
      for (auto& p : models[0]->parameters()) result.weights.push_back(p.detach().cpu().clone());
    }
  };
  if (spec.backend == "nccl") {
    TORCH_CHECK(spec.world_size == 1, "train_gpt: the nccl backend is tested at world size 1 "
                                      "(NCCL refuses two ranks on one GPU)");
    body(deepspeed::comm::make_nccl_communicator_on(c10::make_intrusive<c10d::HashStore>(), 0, 1,
                                                    0, 0, std::chrono::seconds(60)));
  } else if (!spec.hosts.empty()) {
    TORCH_CHECK(static_cast<int>(spec.hosts.size()) == spec.world_size,
                "train_gpt: hosts needs world_size entries");
    run_ranks_on_hosts(spec.hosts, body);
  } else {
    run_ranks(spec.world_size, body);
  }
  for (size_t i = 0; i < result.losses.size(); ++i) {
    if (std::isfinite(result.losses[i])) continue;
    std::ostringstream message;
    message << "train_gpt: the loss of step " << i + 1 << " is " << result.losses[i]
            << " (world size " << spec.world_size << ", config " << spec.config.dump() << ")";
    throw std::runtime_error(message.str());
  }
  return result;
}

std::pair<RunResult, std::vector<int64_t>> train_measuring(
    RunSpec spec, const std::function<int64_t(deepspeed::Engine&)>& held) {
  std::vector<int64_t> bytes(spec.world_size, -1);
  std::mutex mu;
  spec.after_training = [&](deepspeed::Engine& e) {
    const int64_t b = held(e);
    std::lock_guard<std::mutex> lock(mu);
    bytes[e.communicator()->rank()] = b;
  };
  auto r = train_gpt(spec);
  return {std::move(r), bytes};
}

int64_t count_parameters(const gpt::GPTConfig& model) {
  torch::NoGradGuard no_grad;
  gpt::GPTImpl m(model);
  return m.num_parameters();
}

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();

// The larger of m and d, where a NaN d wins: std::max(m, NaN) returns m.
double fold_max(double m, double d) { return d <= m ? m : (std::isnan(d) ? kInf : d); }
}  // namespace

double max_abs_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  TORCH_CHECK(a.size() == b.size(), "different parameter counts");
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    TORCH_CHECK(a[i].sizes() == b[i].sizes(), "parameter ", i, ": shapes differ");
    auto x = a[i].cpu().to(torch::kDouble), y = b[i].cpu().to(torch::kDouble);
    // inf - inf is NaN, and max() propagates NaN; an infinity against a finite value is inf.
    if (!torch::isfinite(x).all().item<bool>() || !torch::isfinite(y).all().item<bool>()) return kInf;
    if (x.numel() > 0) m = fold_max(m, (x - y).abs().max().item<double>());
  }
  return m;
}

double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  TORCH_CHECK(a.size() == b.size(), "different step counts");
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return kInf;
    if (a[i] != b[i]) m = fold_max(m, std::abs(a[i] - b[i]) / std::abs(b[i]));
  }
  return m;
}

double max_weight_diff(const RunResult& a, const RunResult& b) {
  return max_abs_diff(a.weights, b.weights);
}

double max_loss_rel_diff(const RunResult& a, const RunResult& b) {
  return max_rel_diff(a.losses, b.losses);
}

double max_grad_norm_rel_diff(const RunResult& a, const RunResult& b) {
  return max_rel_diff(a.grad_norms, b.grad_norms);
}

Traffic rank0_traffic(RunSpec spec) {
  Traffic t;
  std::mutex mu;
  spec.after_training = [&](deepspeed::Engine& e) {
    if (e.communicator()->rank() != 0) return;
    std::lock_guard<std::mutex> lock(mu);
    for (auto& [op, st] : e.communicator()->stats()) {
      t.bytes += st.bytes;
      t.calls += st.calls;
    }
  };
  train_gpt(spec);
  return t;
}

void mask_attention_key_biases(deepspeed::Engine& engine) {
  for (auto& item : engine.module().named_parameters()) {
    const std::string& name = item.key();
    if (name.size() < 13 || name.compare(name.size() - 13, 13, "attn.qkv.bias") != 0) continue;
    const int64_t embd = item.value().size(0) / 3;
    torch::Tensor mask = torch::ones_like(item.value());
    mask.narrow(0, embd, embd).zero_();
    deepspeed::set_exp_avg_mask(*engine.optimizer(), item.value(), mask);
  }
}

double tail_mean(const std::vector<double>& losses, size_t n) {
  n = std::min(n, losses.size());
  double s = 0;
  for (size_t i = losses.size() - n; i < losses.size(); ++i) s += losses[i];
  return n ? s / n : 0.0;
}

}  // namespace dstest
