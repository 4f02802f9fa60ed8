// Trains the example GPT at a given world size (ranks as threads over one in-process store) and
// returns what equivalence tests compare: per-step losses and rank 0's final weights.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "deepspeed/engine.h"
#include "gpt/model.h"

namespace dstest {

struct RunResult {
  std::vector<double> losses;            // engine.last_loss() after each optimizer step
  std::vector<double> grad_norms;        // engine.get_global_grad_norm() after each optimizer step
  std::vector<torch::Tensor> weights;    // rank 0's parameters after the last step
  std::vector<torch::Tensor> initial;    // rank 0's parameters before training
  std::vector<deepspeed::MemoryReport> memory;  // per rank, after the last step
};

struct RunSpec {
  int world_size = 1;
  nlohmann::json config;       // full ds_config (batch keys included)
  int steps = 10;
  gpt::GPTConfig model{256, 16, 2, 2, 32};
  uint64_t model_seed = 7;
  std::vector<std::string> frozen;  // parameter names to set requires_grad = false
  // Build the models inside the ranks under deepspeed::zero::Init (stage 3). Ranks then draw
  // their initial values from one shared RNG concurrently, so rank 0's are not reproducible:
  // `initial` reports them (gathered after initialize()); pass them as `initial_weights` to a
  // reference run.
  bool zero_init = false;
  std::vector<torch::Tensor> initial_weights;  // if set: copied into every rank's model first
  std::string device = "auto";  // InitializeArgs.device (unit/dist tests run with DS_DEVICE=cpu)
  // "gloo": ranks as threads over Gloo (world size 1: the single-process communicator);
  // "nccl": world size 1 only, an NCCL group of one over an in-process store.
  std::string backend = "gloo";
  // If set (world_size entries): rank r counts as on host hosts[r] (run_ranks_on_hosts).
  std::vector<std::string> hosts;
  // Called on every rank after the last step (e.g. to save a checkpoint); may be empty.
  std::function<void(deepspeed::Engine&)> after_training;
  // Called on every rank after initialize(), before the first step (e.g. to load a checkpoint).
  std::function<void(deepspeed::Engine&)> before_training;
  // If set: called instead of engine.step() after each backward, and must call it (a test that
  // measures the step itself).
  std::function<void(deepspeed::Engine&)> step;
  // If set: each rank's client optimizer (InitializeArgs.optimizer), built over its model.
  std::function<std::shared_ptr<torch::optim::Optimizer>(gpt::GPTImpl&)> client_optimizer;
  // If set: each rank's InitializeArgs.model_parameters, built over its model.
  std::function<std::vector<deepspeed::ParamGroup>(gpt::GPTImpl&)> model_parameters;
};

int64_t count_parameters(const gpt::GPTConfig& model);
// The test text (data/fortunes.txt) in windows of `block` bytes.
std::shared_ptr<deepspeed::Dataset> test_text_dataset(int64_t block);

// The small test model and the default config around it.
nlohmann::json base_config(int micro_batch, int accumulation, int stage);
// Throws std::runtime_error (naming the step) if a loss is not finite: a run that went NaN must
// not reach a comparison.
RunResult train_gpt(const RunSpec& spec);
// The optimizer-state bytes of every rank's MemoryReport, summed.
int64_t optimizer_state_bytes(const RunResult& result);
// train_gpt, and each rank's bytes `held` reads from its engine after the last step (its
// after_training is replaced), beside the run (whose memory reports are taken right after).
std::pair<RunResult, std::vector<int64_t>> train_measuring(
    RunSpec spec, const std::function<int64_t(deepspeed::Engine&)>& held);

// What an fp32 run at another world size or ZeRO stage may differ from its reference by: only
// summation orders differ, so losses agree to 1e-5 relative and weights to 2e-4 absolute (why:
// tests/dist/engine_stage0_test.cpp).
constexpr double kLossTol = 1e-5;
constexpr double kWeightTol = 2e-4;
// The per-step global gradient norms (get_global_grad_norm) likewise, where both runs compute the
// norm of the same averaged gradient: measured at most 3e-8 relative at the first step (same
// weights, only summation orders differ) and 7.1e-7 over 10-20 steps (the weights drift apart as
// above: stage 2 and stage 0 at 3 ranks). A missing or doubled average, which AdamW's scale
// invariance hides from losses and weights, moves every step's norm by a factor of the world size
// or the accumulation steps.
constexpr double kGradNormTol = 1e-5;
// The same for two 16-bit runs (bf16 weights and gradients): bf16 rounds to 2^-8 relative.
constexpr double kBf16GradNormTol = 4e-3;

// max |a - b| over tensors of equal shapes, and the largest |a - b| / |b| over values (0 where
// a == b, 0 == 0 included). A NaN or infinity on either side makes the result +infinity, so that
// `EXPECT_LT(diff, tol)` fails: std::max(m, NaN) is m, which let runs that went NaN pass.
double max_abs_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b);
double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b);
// The same over two runs' weights, losses and per-step global gradient norms.
double max_weight_diff(const RunResult& a, const RunResult& b);
double max_loss_rel_diff(const RunResult& a, const RunResult& b);
double max_grad_norm_rel_diff(const RunResult& a, const RunResult& b);

// Bytes and collectives rank 0's communicator counted over a whole run of `spec` (the weights'
// broadcast included); spec.after_training is replaced.
struct Traffic {
  int64_t bytes = 0, calls = 0;
};
Traffic rank0_traffic(RunSpec spec);
// DeepSpeed's exp_avg_mask for the test GPT under a 1-bit optimizer (set_exp_avg_mask): the key
// third of every attention qkv bias gets a zero gradient (softmax cancels it), so its momentum is
// masked, as DeepSpeed's BERT example masks position rows. Use as RunSpec::before_training.
void mask_attention_key_biases(deepspeed::Engine& engine);
// The mean of the last `n` losses.
double tail_mean(const std::vector<double>& losses, size_t n);

}  // namespace dstest
