// gpt_train's engine loop (forward / backward / step per micro-batch, the progress line, periodic
// checkpoints, the gpt_train_report line) over the whole GPT or its tensor-parallel split, and
// what builds the run both share.
#pragma once
#include <memory>
#include <string>

#include "gpt/model.h"
#include "gpt/tp_model.h"
#include "gpt/train_options.h"

namespace gpt_train {

// The training loop over any model whose forward(idx, targets) returns the loss (the GPT, or
// its tensor-parallel split).
struct Run {
  Options opt;
  deepspeed::Config config;
  deepspeed::comm::CommunicatorPtr comm;
  std::shared_ptr<deepspeed::Dataset> data;
  std::shared_ptr<torch::optim::Optimizer> client_optimizer;
  int64_t num_params = 0;
  std::shared_ptr<deepspeed::comm::Topology> topology;  // tensor parallelism; null without
};

// Loads the config (batch keys per data-parallel rank: world / `data_parallel_divisor`), builds the
// whole GPT (under zero::Init with --zero_init) and the client AdamW when the config has none,
// and prints what was filled. Returns the run and the model.
std::pair<Run, std::shared_ptr<gpt::GPTImpl>> prepare_run(
    const Options& opt, const std::string& config_path,
    const deepspeed::comm::CommunicatorPtr& comm, int data_parallel_divisor);

// Trains to --steps; returns the exit status. COLLECTIVE over the world.
int train(const Run& run, std::shared_ptr<gpt::GPTImpl> model);
int train(const Run& run, std::shared_ptr<gpt::TPGPTImpl> model);

}  // namespace gpt_train
