#include "support/pipeline_gpt.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <mutex>

#include "deepspeed/engine.h"
#include "gpt/pipeline_model.h"
#include "support/ranks.h"

namespace dstest {

gpt::GPTConfig tiny_pipeline_gpt(bool tied) {
  gpt::GPTConfig c;
  c.vocab_size = 64;
  c.block_size = 8;
  c.n_layer = 4;
  c.n_head = 2;
  c.n_embd = 16;
  c.tie_embeddings = tied;
  return c;
}

deepspeed::pipe::MicroBatch pipeline_micro_batch(int step, int g) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 * step + g + 1);
  auto x = torch::randint(0, 64, {kPipeMicro, 9}, gen, torch::kLong);
  return {x.narrow(1, 0, 8).contiguous(), x.narrow(1, 1, 8).contiguous()};
}

nlohmann::json pipeline_config(int dp_size, int zero_stage, double clipping) {
  nlohmann::json c = {
      {"train_micro_batch_size_per_gpu", kPipeMicro},
      {"gradient_accumulation_steps", kPipeGlobalMicro / dp_size},
      {"steps_per_print", 0},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.01}}}}},
      {"zero_optimization", {{"stage", zero_stage}, {"reduce_bucket_size", 500}}},
      {"seed", 5},
  };
  if (clipping > 0) {
    c["gradient_clipping"] = clipping;
    c["optimizer"] = {{"type", "SGD"}, {"params", {{"lr", 1.0}}}};
  }
  return c;
}

deepspeed::pipe::PipelineInitializeArgs pipeline_args(deepspeed::comm::CommunicatorPtr comm,
                                                      int stages, int zero_stage,
                                                      const gpt::GPTConfig& model) {
  return pipeline_args(std::move(comm), stages, zero_stage, gpt::gpt_pipeline(model));
}

deepspeed::pipe::PipelineInitializeArgs pipeline_args(deepspeed::comm::CommunicatorPtr comm,
                                                      int stages, int zero_stage,
                                                      deepspeed::pipe::PipelineModule model) {
  deepspeed::pipe::PipelineInitializeArgs args;
  args.model = std::move(model);
  args.model.num_stages = stages;
  args.config_json = pipeline_config(comm->world_size() / stages, zero_stage);
  args.comm = std::move(comm);
  args.device = "cpu";
  return args;
}

std::vector<double> train_pipeline_steps(deepspeed::pipe::PipelineEngine& engine,
                                         const deepspeed::comm::CommunicatorPtr& comm, int from,
                                         int to) {
  const int dp_size = comm->world_size() / engine.num_stages();
  const int data_rank = comm->rank() % dp_size;
  std::vector<double> losses;
  for (int k = from; k < to; ++k) {
    int m = 0;
    losses.push_back(
        engine.train_batch([&] { return pipeline_micro_batch(k, (m++) * dp_size + data_rank); }));
  }
  return losses;
}

std::vector<double> one_module_losses(int world, const gpt::GPTConfig& model,
                                      const nlohmann::json& config, const std::string& device,
                                      int steps) {
  std::vector<double> losses;
  std::mutex mu;
  run_ranks(world, [&](deepspeed::comm::CommunicatorPtr comm) {
    deepspeed::InitializeArgs<deepspeed::pipe::PipelineSequentialImpl> args;
    args.model = std::make_shared<deepspeed::pipe::PipelineSequentialImpl>(gpt::gpt_pipeline(model), 5);
    args.config_json = config;
    args.comm = comm;
    args.device = device;
    auto engine = deepspeed::initialize(args).engine;
    const int gas = kPipeGlobalMicro / world;
    std::vector<double> mine;
    for (int k = 0; k < steps; ++k) {
      for (int m = 0; m < gas; ++m) {
        auto [x, y] = pipeline_micro_batch(k, m * world + comm->rank());
        engine->backward(engine->forward(x, y));
        engine->step();
      }
      mine.push_back(engine->last_loss());
    }
    std::lock_guard<std::mutex> lock(mu);
    if (comm->rank() == 0) losses = mine;
  });
  return losses;
}

}  // namespace dstest
