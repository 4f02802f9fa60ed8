// Training runs of the test GPT that save and load checkpoints (ranks as threads), for the
// checkpoint tests: one call = one "job" that may resume from a checkpoint and save during it.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "deepspeed/engine.h"
#include "gpt/model.h"

namespace dstest {

struct CheckpointJob {
  int world_size = 1;
  nlohmann::json config;           // full ds_config
  int steps = 10;                  // train until global_steps reaches this
  gpt::GPTConfig model{256, 16, 2, 2, 32};
  uint64_t model_seed = 7;         // a resumed job should use another seed: loading must win
  std::string save_dir;            // saves at the steps in save_at (and at the end if save_at_end)
  std::vector<int> save_at;
  bool save_at_end = false;
  std::string load_dir;            // non-empty: load_checkpoint(load_dir, load_tag) first
  std::string load_tag;
  bool load_optimizer_states = true;
};

struct CheckpointJobResult {
  std::vector<double> losses;          // last_loss() of each optimizer step this job ran
  std::vector<int64_t> steps;          // global_steps() after each of those steps
  std::vector<torch::Tensor> weights;  // rank 0's parameters at the end
  int64_t start_step = 0;              // global_steps() after loading
  nlohmann::json client_state;         // what load_checkpoint returned on rank 0
  std::string load_path;
};

CheckpointJobResult run_checkpoint_job(const CheckpointJob& job);

// A saved checkpoint read whole (its `latest` tag under save_dir): the masters and the moments
// per parameter (Adam's two, Lion's exp_avg, Adagrad's sum), consolidated across ranks and tensor
// slices, and the manifest metadata. The moments the checkpoint's optimizer format does not hold
// stay empty.
struct ConsolidatedState {
  std::vector<std::pair<std::string, torch::Tensor>> fp32, exp_avg, exp_avg_sq, sum,
      momentum_buffer;
  nlohmann::json meta;
};
ConsolidatedState consolidated_state(const std::string& save_dir);

// One engine in this thread (world size 1) for tests that drive it step by step.
struct SingleEngine {
  std::shared_ptr<gpt::GPTImpl> model;
  std::shared_ptr<deepspeed::ModelEngine<gpt::GPTImpl>> engine;
  std::shared_ptr<deepspeed::DataLoader> loader;
  void train(int steps);  // optimizer steps
  std::vector<torch::Tensor> weights() const;  // clones of the parameters
};
// `frozen`: parameter names set to requires_grad = false before initialize().
SingleEngine make_single_engine(const nlohmann::json& config, const gpt::GPTConfig& model = {256, 16, 2, 2, 32},
                                uint64_t seed = 7, const std::vector<std::string>& frozen = {});
// The same on one rank of ranks as threads (run_ranks): `args` as for initialize() (config_json,
// comm or topology, ...), its model and training_data set here. Ranks build their models one at a
// time, each from `seed`: libtorch's generator is global (initialize() broadcasts rank 0's).
SingleEngine make_rank_engine(deepspeed::InitializeArgs<gpt::GPTImpl> args,
                              const gpt::GPTConfig& model = {256, 16, 2, 2, 32}, uint64_t seed = 7,
                              const std::vector<std::string>& frozen = {});
}  // namespace dstest
