#include "gpt/train_pipeline.h"

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "gpt/model_flags.h"
#include "gpt/pipeline_model.h"
#include "gpt/progress.h"
#include "gpt/tp_model.h"
#include "gpt/tp_pipeline_model.h"

namespace gpt_train {
namespace {

// The stage count of --pipeline_stages: the flag's, or (-1) the config's pipeline.stages, read as
// the engine reads the file (hjson: comments, trailing commas). Reading it resolves the batch keys
// per data-parallel rank, which depends on the stage count being read: each data-parallel size
// the world allows is tried until the batch keys resolve (the pipeline block reads the same in
// all of them); when none does, the first error is the file's.
int pipeline_stage_count(const Options& opt, const std::string& config_path, int world_size) {
  if (opt.pipeline_stages > 0) return opt.pipeline_stages;
  const int per_tensor = world_size / std::max(1, opt.tensor_parallel);
  std::string stages, error;
  for (int s = 1; s <= per_tensor && stages.empty(); ++s) {
    if (per_tensor % s != 0) continue;
    std::vector<std::string> warnings;  // initialize_pipeline() reports them
    try {
      stages = deepspeed::load_config(config_path, per_tensor / s, trainer_values(opt), &warnings)
                   .pipeline.stages;
    } catch (const deepspeed::ConfigError& e) {
      if (error.empty()) error = e.what();
    }
  }
  if (stages.empty()) throw deepspeed::ConfigError(error);
  if (stages == "auto")
    throw deepspeed::ConfigError(
        "gpt_train: --pipeline_stages -1 needs a number in the config's "
        "pipeline.stages (" +
        config_path + ")");
  return std::stoi(stages);
}

// What gpt_train does without the pipeline but cannot do with it, refused by name.
void refuse_unsupported(const Options& opt, const deepspeed::Config& config,
                        const std::string& config_path) {
  if (opt.zero_init)
    throw deepspeed::ConfigError(
        "gpt_train: --zero_init with --pipeline_stages: the pipeline builds each stage's layers "
        "itself and runs ZeRO stage 0-2 only (zero::Init is ZeRO-3's)");
  // Without the pipeline gpt_train builds an AdamW from its flags; initialize_pipeline() takes no
  // client optimizer, only the config's.
  if (!config.optimizer)
    throw deepspeed::ConfigError(
        "gpt_train: --pipeline_stages: the config (" + config_path +
        ") has no \"optimizer\" block, and the pipeline engine builds its optimizer from the "
        "config only (the AdamW from --lr/--weight_decay/... is not available with the "
        "pipeline); add one, e.g. \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": "
        "\"auto\", \"betas\": \"auto\", \"eps\": \"auto\", \"weight_decay\": \"auto\"}}");
}

}  // namespace

int train_pipeline(const Options& opt, const std::string& config_path,
                   const deepspeed::comm::CommunicatorPtr& comm,
                   const std::shared_ptr<deepspeed::Dataset>& data) {
  const int stages = pipeline_stage_count(opt, config_path, comm->world_size());
  const int tensor = opt.tensor_parallel;
  // (Without tensor parallelism initialize_pipeline() names a bad stage count itself.)
  if (tensor > 1 && (stages < 1 || comm->world_size() % (stages * tensor) != 0))
    throw deepspeed::ConfigError("gpt_train: --pipeline_stages " + std::to_string(stages) +
                                 " x --tensor_parallel " + std::to_string(tensor) +
                                 " does not divide the world size " +
                                 std::to_string(comm->world_size()));
  if (tensor > 1) gpt::check_tensor_parallel(opt.model, tensor);
  std::vector<std::string> warnings;  // initialize_pipeline() reports them
  const int dp = comm->world_size() / std::max(1, stages * tensor);
  const auto config = deepspeed::load_config(config_path, dp, trainer_values(opt), &warnings);
  refuse_unsupported(opt, config, config_path);
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
  // --seed seeds the layers (initialize_pipeline() seeds layer i with "seed" + i), as it seeds the
  // whole GPT without the pipeline; the data order keeps the config's seed, as there.
  args.config_json = with_monitoring(config.raw, opt);
  args.config_json["seed"] = opt.seed;
  args.comm = comm;
  args.device = opt.device;
  // With dataloader_drop_last false (the default) an epoch may end in a short micro-batch (the
  // shard of one data-parallel rank is ceil(samples / dp) windows): its activations have another
  // shape, so the shapes go with every micro-batch then.
  const int64_t micro = config.train_micro_batch_size_per_gpu;
  args.dynamic_shape =
      !config.dataloader_drop_last && ((data->size() + dp - 1) / std::max(1, dp)) % micro != 0;
  std::shared_ptr<deepspeed::pipe::PipelineEngine> engine;
  try {
    engine = deepspeed::pipe::initialize_pipeline(args);
  } catch (const deepspeed::ConfigError& e) {
    // Its stage-count errors name PipelineModule.num_stages, which gpt_train fills from the flag
    // (with -1, from the config's pipeline.stages): say which one the user gave.
    const std::string what = e.what();
    if (what.find("PipelineModule.num_stages") == std::string::npos) throw;
    const std::string given = opt.pipeline_stages > 0
                                  ? "--pipeline_stages " + std::to_string(stages)
                                  : "pipeline.stages " + std::to_string(stages) + " in " +
                                        config_path + " (--pipeline_stages -1)";
    throw deepspeed::ConfigError(what + " [gpt_train: PipelineModule.num_stages is " + given +
                                 "]");
  }
  // The tensor ranks of one stage read the same micro-batches (their data rank's).
  const deepspeed::comm::Grid grid(comm->world_size(), {stages, tensor});
  const int dp_size = grid.data_size(), dp_rank = grid.coordinates(comm->rank()).data;
  // The loader names its constructor's arguments; here they come from the config's keys.
  auto make_loader = [&] {
    try {
      return deepspeed::DataLoader(data, micro, dp_rank, dp_size, config.seed, /*shuffle=*/true,
                                   config.dataloader_drop_last);
    } catch (const deepspeed::ConfigError& e) {
      throw deepspeed::ConfigError(
          "gpt_train: the pipeline's loader (train_micro_batch_size_per_gpu " +
          std::to_string(micro) + ", dataloader_drop_last " +
          (config.dataloader_drop_last ? "true" : "false") + "): " + e.what());
    }
  };
  deepspeed::DataLoader loader = make_loader();
  auto next = [&] {
    auto b = loader.next();
    return deepspeed::pipe::MicroBatch{b.data, b.target};
  };
  if (comm->rank() == 0 && !config.auto_filled.empty())
    std::printf("gpt_train: filled \"auto\" config keys from the command line and the model: %s\n",
                filled_keys(config).c_str());
  if (!opt.load_dir.empty()) {
    auto loaded = engine->load_checkpoint(opt.load_dir);
    // The samples the checkpoint trained, in this job's micro-batches per data rank (the saved
    // job's accumulation and data-parallel size may differ from this one's).
    const int64_t consumed = resumed_micro_batches(engine->global_samples(), micro, dp_size);
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
  const double tokens_per_step = double(engine->train_batch_size()) * opt.model.block_size;
  gpt::ProgressLine progress(opt.steps, tokens_per_step, gpt::stdout_is_terminal());
  gpt::TokensPerSecondEvent tokens_event(tokens_per_step);
  while (engine->global_steps() < opt.steps) {
    const double loss = engine->train_batch(next);
    if (engine->global_steps() > first_step + opt.warmup) {
      wall_s += engine->last_batch_timing().wall_s;
      compute_s += engine->last_batch_timing().compute_s;
      step_s += engine->last_batch_timing().step_s;
    }
    if (rank0)
      progress.on_step(engine->global_steps(), loss, opt.exact_loss,
                       gpt::engine_prints_at(engine->config(), engine->global_steps() + 1));
    tokens_event.on_step(*engine);
    if (engine->global_steps() == first_step + opt.warmup)
      timed_from = std::chrono::steady_clock::now();
    if (saves_after(opt, engine->global_steps())) {
      engine->save_checkpoint(opt.save_dir);
      // gpt_generate builds the model from it (model_flags.h).
      if (rank0) gpt::save_model_flags(opt.save_dir, opt.model);
      progress.finish();  // on a terminal, the line ends before this one
      if (rank0)
        std::printf("gpt_train: saved %s/global_step%lld\n", opt.save_dir.c_str(),
                    static_cast<long long>(engine->global_steps()));
    }
  }
  const auto end = std::chrono::steady_clock::now();
  progress.finish();
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
  // activation_checkpointing.profile, as train_loop prints it: each stage recomputes its own
  // layers, so the first rank of each stage (data and tensor rank 0) prints its counts.
  const auto at = grid.coordinates(comm->rank());
  if (deepspeed::checkpointing::options().profile && at.data == 0 && at.tensor == 0)
    std::printf("gpt_train: stage %d: %s\n", engine->stage_id(),
                deepspeed::checkpointing::profile_summary().c_str());
  return 0;
}

}  // namespace gpt_train
