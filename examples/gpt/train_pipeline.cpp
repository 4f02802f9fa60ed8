#include "gpt/train_pipeline.h"

#include <chrono>
#include <cstdio>
#include <fstream>

#include "gpt/pipeline_model.h"
#include "gpt/tp_model.h"
#include "gpt/tp_pipeline_model.h"

namespace gpt_train {
namespace {

// The stage count of --pipeline_stages: the flag's, or (-1) the config's pipeline.stages.
int pipeline_stage_count(const Options& opt, const std::string& config_path) {
  if (opt.pipeline_stages > 0) return opt.pipeline_stages;
  std::ifstream in(config_path);
  const auto raw =
      nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false, /*comments=*/true);
  if (raw.is_object() && raw.contains("pipeline") && raw["pipeline"].contains("stages") &&
      raw["pipeline"]["stages"].is_number_integer())
    return raw["pipeline"]["stages"].get<int>();
  throw deepspeed::ConfigError(
      "gpt_train: --pipeline_stages -1 needs a number in the config's "
      "pipeline.stages (" +
      config_path + ")");
}

}  // namespace

int train_pipeline(const Options& opt, const std::string& config_path,
                   const deepspeed::comm::CommunicatorPtr& comm,
                   const std::shared_ptr<deepspeed::Dataset>& data) {
  const int stages = pipeline_stage_count(opt, config_path);
  const int tensor = opt.tensor_parallel;
  // (Without tensor parallelism initialize_pipeline() names a bad stage count itself.)
  if (tensor > 1 && (stages < 1 || comm->world_size() % (stages * tensor) != 0))
    throw deepspeed::ConfigError("gpt_train: --pipeline_stages " + std::to_string(stages) +
                                 " x --tensor_parallel " + std::to_string(tensor) +
                                 " does not divide the world size " +
                                 std::to_string(comm->world_size()));
  if (tensor > 1) gpt::check_tensor_parallel(opt.model, tensor);
  std::vector<std::string> warnings;  // initialize_pipeline() reports them
  const auto config =
      deepspeed::load_config(config_path, comm->world_size() / std::max(1, stages * tensor),
                             trainer_values(opt), &warnings);
  deepspeed::pipe::PipelineInitializeArgs args;
  // With --tensor_parallel the grid comes first (COLLECTIVE): the layers are built over its tensor
  // group. Rank = (stage * data + data rank) * tensor + tensor rank (deepspeed/topology.h).
  // Without, initialize_pipeline() builds pipe x data itself (and names a bad stage count).
  if (tensor > 1)
    args.topology = std::make_shared<deepspeed::comm::Topology>(
        comm, deepspeed::comm::TopologySizes{stages, tensor});
  args.model = tensor > 1 ? gpt::gpt_tp_pipeline(opt.model, args.topology->tensor_parallel())
                          : gpt::gpt_pipeline(opt.model);
  args.model.num_stages = stages;
  args.config_json = config.raw;
  args.comm = comm;
  args.device = opt.device;
  auto engine = deepspeed::pipe::initialize_pipeline(args);
  // The tensor ranks of one stage read the same micro-batches (their data rank's).
  const deepspeed::comm::Grid grid(comm->world_size(), {stages, tensor});
  const int dp_size = grid.data_size(), dp_rank = grid.coordinates(comm->rank()).data;
  deepspeed::DataLoader loader(data, engine->train_micro_batch_size_per_gpu(), dp_rank, dp_size,
                               engine->config().seed, /*shuffle=*/true, /*drop_last=*/true);
  auto next = [&] {
    auto b = loader.next();
    return deepspeed::pipe::MicroBatch{b.data, b.target};
  };
  if (comm->rank() == 0 && !config.auto_filled.empty())
    std::printf("gpt_train: filled \"auto\" config keys from the command line and the model: %s\n",
                filled_keys(config).c_str());
  if (!opt.load_dir.empty()) {
    auto loaded = engine->load_checkpoint(opt.load_dir);
    const int64_t consumed = engine->global_steps() * engine->gradient_accumulation_steps();
    loader.load_state(
        {consumed / loader.batches_per_epoch(), consumed % loader.batches_per_epoch()});
    if (comm->rank() == 0 && !loaded.load_path.empty())
      std::printf("gpt_train: resumed from %s at step %lld\n", loaded.load_path.c_str(),
                  static_cast<long long>(engine->global_steps()));
  }
  const bool rank0 = comm->rank() == 0;
  if (rank0)
    std::printf(
        "gpt_train: pipeline %d stages x %d data-parallel x %d tensor-parallel, zero stage "
        "%d, micro batch %lld, accumulation %lld\n",
        stages, dp_size, tensor, engine->config().zero_optimization.stage,
        static_cast<long long>(engine->train_micro_batch_size_per_gpu()),
        static_cast<long long>(engine->gradient_accumulation_steps()));
  const int64_t first_step = engine->global_steps();  // > 0 after a resume
  auto start = std::chrono::steady_clock::now(), timed_from = start;
  // Over the timed steps, for the measured bubble: the schedule's wall time (without the
  // optimizer step) and the forward/backward compute inside it.
  double wall_s = 0.0, compute_s = 0.0, step_s = 0.0;
  while (engine->global_steps() < opt.steps) {
    const double loss = engine->train_batch(next);
    if (engine->global_steps() > first_step + opt.warmup) {
      wall_s += engine->last_batch_timing().wall_s;
      compute_s += engine->last_batch_timing().compute_s;
      step_s += engine->last_batch_timing().step_s;
    }
    if (rank0 && opt.exact_loss)
      std::printf("step %lld loss %.4f exact %a\n", static_cast<long long>(engine->global_steps()),
                  loss, loss);
    else if (rank0)
      std::printf("step %lld loss %.4f\n", static_cast<long long>(engine->global_steps()), loss);
    if (engine->global_steps() == first_step + opt.warmup)
      timed_from = std::chrono::steady_clock::now();
    if (opt.save_interval > 0 && engine->global_steps() % opt.save_interval == 0) {
      engine->save_checkpoint(opt.save_dir);
      if (rank0)
        std::printf("gpt_train: saved %s/global_step%lld\n", opt.save_dir.c_str(),
                    static_cast<long long>(engine->global_steps()));
    }
  }
  const auto end = std::chrono::steady_clock::now();
  const int64_t timed_steps = std::max<int64_t>(1, opt.steps - first_step - opt.warmup);
  const double seconds = opt.steps - first_step > opt.warmup
                             ? std::chrono::duration<double>(end - timed_from).count()
                             : 0.0;
  // train_batch_size is the global batch (micro x accumulation x data-parallel ranks).
  const double tokens = double(timed_steps) * engine->train_batch_size() * opt.model.block_size;
  std::printf(
      "gpt_train_report rank=%d stage=%d step_ms=%.2f tokens_per_s=%.1f final_loss=%.5f "
      "peak_rss_kb=%ld max_activations_held=%d idle_fraction=%.4f step_fraction=%.4f\n",
      comm->rank(), engine->stage_id(), 1e3 * seconds / timed_steps,
      seconds > 0 ? tokens / seconds : 0.0, engine->last_loss(), peak_rss_kb(),
      engine->max_activations_held(), wall_s > step_s ? 1.0 - compute_s / (wall_s - step_s) : 0.0,
      wall_s > 0 ? step_s / wall_s : 0.0);
  return 0;
}

}  // namespace gpt_train
