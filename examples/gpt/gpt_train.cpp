// Trains the example GPT with deepspeed.cpp:
//   dsrun --num_procs 2 build/bin/gpt_train --deepspeed_config examples/gpt/ds_config.json
// Rank 0 prints "step <n> loss <x>" after each optimizer step, and a summary at the end.
// Checkpoints: --save_dir DIR --save_interval K saves DIR/global_step<N> every K steps (--save_dir
// alone: once, after the last step); --load_dir DIR resumes from DIR/latest and continues the
// step count up to --steps.
// --tensor_parallel N splits the layers over groups of N consecutive ranks (gpt::TPGPT, built
// from the whole GPT of --seed on every rank; world = N x data-parallel ranks; checkpoints save
// and resume as without it; with --activation_checkpointing the config's partition_activations
// splits the saved block inputs over the group).
// --pipeline_stages M trains the GPT as a PipelineModule (train_pipeline.h); with
// --tensor_parallel N each stage's layers are split too (world = M x data x N). It needs an
// "optimizer" block in the config and refuses --zero_init; --activation_checkpointing makes every
// layer of a stage a checkpointed segment.
// The paths live beside this file: train_options (flags), train_loop (the engine loop),
// train_tensor_parallel, train_pipeline.
// Like the Hugging Face Trainer, the training flags (--lr, --weight_decay, --adam_beta1/2,
// --adam_epsilon, --max_grad_norm, --warmup_steps, --micro_batch, --gradient_accumulation_steps,
// --fp16/--bf16; --steps and --n_embd) fill the config's "auto" keys, and with no "optimizer"
// block they build an AdamW (biases and LayerNorm weights without weight decay, as HF's, at every
// stage, precision and offload); values written in the config win over the flags' defaults.
#include <cstdio>
#include <string>

#include "deepspeed/deepspeed.h"
#include "gpt/train_loop.h"
#include "gpt/train_options.h"
#include "gpt/train_pipeline.h"
#include "gpt/train_tensor_parallel.h"

int main(int argc, char** argv) try {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a killed run's log still has every finished line
  auto args = deepspeed::parse_args(argc, argv);
  auto opt = gpt_train::parse_options(args.rest);
  at::set_num_threads(opt.threads > 0 ? opt.threads : gpt_train::threads_from_env());
  if (args.config_path.empty())
    throw deepspeed::ConfigError("gpt_train: --deepspeed_config FILE is required");

  deepspeed::comm::InitOptions init;
  init.config_path = args.config_path;  // its comm_timeout_seconds bounds every collective
  auto comm = deepspeed::init_distributed(init);
  torch::manual_seed(opt.seed);
  const c10::Device device = deepspeed::resolve_device(opt.device, comm->local_rank());
  if (opt.gpu_mem_cap_gib > 0)
    deepspeed::cap_device_memory(device, static_cast<int64_t>(opt.gpu_mem_cap_gib * (1LL << 30)));
  if (opt.pipeline_stages != 0)
    return gpt_train::train_pipeline(opt, args.config_path, comm, gpt_train::make_dataset(opt));
  if (opt.tensor_parallel != 1)
    return gpt_train::train_tensor_parallel(opt, args.config_path, comm);
  // The config is read once: its dtype is needed before the model is built (zero::Init keeps the
  // slices in it), and initialize() gets the parsed document, its "auto" keys filled from the
  // flags and the model as the Hugging Face Trainer fills them.
  auto [run, model] = gpt_train::prepare_run(opt, args.config_path, comm, 1);
  return gpt_train::train(run, model);
} catch (const c10::Error& e) {
  // what() carries libtorch 1.13's C++ stack frames: the message alone.
  std::fprintf(stderr, "gpt_train: error: %s\n", e.what_without_backtrace());
  return 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "gpt_train: error: %s\n", e.what());
  return 1;
}
