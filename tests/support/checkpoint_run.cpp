#include "support/checkpoint_run.h"

#include <mutex>
#include <stdexcept>

#include "checkpoint/consolidate.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "checkpoint/tag_reader.h"
#include "support/ranks.h"
#include "support/training_run.h"

namespace dstest {
ConsolidatedState consolidated_state(const std::string& save_dir) {
  namespace ckpt = deepspeed::checkpoint;
  auto& fs = ckpt::posix_file_system();
  const std::string dir = ckpt::resolve_tag_dir(fs, save_dir);
  ConsolidatedState out;
  out.meta = ckpt::read_manifest(fs, dir).metadata;
  // The kinds the optimizer's format holds (Lion: no exp_avg_sq; an archive: the masters alone).
  for (const auto& kind : ckpt::state_kinds(out.meta["optimizer"]["format"].get<std::string>())) {
    auto whole = ckpt::consolidate_trainable(fs, dir, kind);
    if (kind == "fp32") out.fp32 = std::move(whole);
    else if (kind == "exp_avg") out.exp_avg = std::move(whole);
    else if (kind == "exp_avg_sq") out.exp_avg_sq = std::move(whole);
    else if (kind == "sum") out.sum = std::move(whole);
    else if (kind == "momentum_buffer") out.momentum_buffer = std::move(whole);
    else throw std::runtime_error("consolidated_state: unknown state kind " + kind);
  }
  return out;
}

SingleEngine make_single_engine(const nlohmann::json& config, const gpt::GPTConfig& model, uint64_t seed,
                                const std::vector<std::string>& frozen) {
  at::set_num_threads(1);
  return make_rank_engine(
      {.config_json = config, .comm = deepspeed::comm::make_single_process_communicator()}, model, seed,
      frozen);
}

SingleEngine make_rank_engine(deepspeed::InitializeArgs<gpt::GPTImpl> args, const gpt::GPTConfig& model,
                              uint64_t seed, const std::vector<std::string>& frozen) {
  static std::mutex building;
  SingleEngine e;
  {
    std::lock_guard<std::mutex> lock(building);
    torch::manual_seed(seed);
    e.model = std::make_shared<gpt::GPTImpl>(model);
  }
  for (auto& name : frozen) e.model->named_parameters()[name].set_requires_grad(false);
  args.model = e.model;
  args.training_data = test_text_dataset(model.block_size);
  auto r = deepspeed::initialize<gpt::GPTImpl>(std::move(args));
  e.engine = r.engine;
  e.loader = r.training_dataloader;
  return e;
}

void SingleEngine::train(int steps) {
  const int64_t until = engine->global_steps() + steps;
  while (engine->global_steps() < until) {
    auto batch = loader->next();
    engine->backward(engine->forward(batch.data, batch.target));
    engine->step();
  }
}

std::vector<torch::Tensor> SingleEngine::weights() const {
  std::vector<torch::Tensor> out;
  for (auto& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

CheckpointJobResult run_checkpoint_job(const CheckpointJob& job) {
  at::set_num_threads(1);
  std::vector<std::shared_ptr<gpt::GPTImpl>> models;
  for (int r = 0; r < job.world_size; ++r) {
    torch::manual_seed(job.model_seed + 1000 * r);
    models.push_back(std::make_shared<gpt::GPTImpl>(job.model));
  }
  auto data = test_text_dataset(job.model.block_size);
  CheckpointJobResult result;
  std::mutex mu;
  run_ranks(job.world_size, [&](deepspeed::comm::CommunicatorPtr comm) {
    const int rank = comm->rank();
    auto [engine, optimizer, loader, scheduler] = deepspeed::initialize<gpt::GPTImpl>(
        {.model = models[rank], .config_json = job.config, .training_data = data, .comm = comm});
    deepspeed::LoadedCheckpoint loaded;
    if (!job.load_dir.empty())
      loaded = engine->load_checkpoint(job.load_dir, job.load_tag, true, job.load_optimizer_states);
    const int64_t start = engine->global_steps();
    std::vector<double> losses;
    std::vector<int64_t> steps;
    while (engine->global_steps() < job.steps) {
      auto batch = loader->next();
      auto loss = engine->forward(batch.data, batch.target);
      engine->backward(loss);
      bool boundary = engine->is_gradient_accumulation_boundary();
      engine->step();
      if (!boundary) continue;
      losses.push_back(engine->last_loss());
      steps.push_back(engine->global_steps());
      for (int s : job.save_at)
        if (s == engine->global_steps())
          engine->save_checkpoint(job.save_dir, "", {{"step", s}, {"note", "client"}});
    }
    if (job.save_at_end) engine->save_checkpoint(job.save_dir);
    auto whole = engine->gathered_parameters();  // stage 3: the parameters are partitioned
    if (rank != 0) return;
    std::lock_guard<std::mutex> lock(mu);
    result.losses = losses;
    result.steps = steps;
    result.start_step = start;
    result.client_state = loaded.client_state;
    result.load_path = loaded.load_path;
    for (auto& p : models[0]->parameters()) result.weights.push_back(p.detach().clone());
  });
  return result;
}

}  // namespace dstest
