// gpt_train's command line (Options, parse_options) and what every training path shares: the
// "auto" config values the flags fill (as the Hugging Face Trainer), the AdamW built when the
// config has no optimizer block, the dataset, the peak resident set for the report line.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "deepspeed/deepspeed.h"
#include "gpt/model.h"

namespace gpt_train {

struct Options {
  std::string data = DS_DEFAULT_TEXT;
  int64_t steps = 100;
  gpt::GPTConfig model;
  int64_t stride = 0;  // 0: block_size / 2
  uint64_t seed = 1234;
  int threads = 0;  // 0: OMP_NUM_THREADS, else 1
  std::string save_dir;       // with save_interval 0: one save, after the last step
  int64_t save_interval = 0;  // 0: no periodic saves
  int pipeline_stages = 0;    // > 0: the GPT as a PipelineModule, trained with train_batch;
                              // -1: the config's pipeline.stages; below -1 refused
  int tensor_parallel = 1;    // > 1: layers split over groups of N consecutive ranks (with the
                              // pipeline too: world = stages x data x N); below 1 refused
  std::string load_dir;
  bool zero_init = false;   // build the model under deepspeed::zero::Init (ZeRO stage 3)
  bool exact_loss = false;  // print each step's loss also as a hex float (bit-for-bit comparisons)
  // The trainer's values (HF TrainingArguments' names): they fill "auto" config keys and build
  // the AdamW used when the config has no optimizer block. Defaults: the example config's.
  double lr = 6e-4;
  double weight_decay = 0.01;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.99;
  double adam_epsilon = 1e-8;
  double max_grad_norm = 1.0;
  int64_t warmup_steps = 0;
  int64_t micro_batch = 8;
  int64_t gradient_accumulation_steps = 1;
  bool fp16 = false;
  bool bf16 = false;
  std::string device = "auto";  // deepspeed/device.h
  bool random_tokens = false;   // uniform random tokens of the model's vocabulary (benchmarks)
  int64_t warmup = 1;           // optimizer steps left out of the timing
  double gpu_mem_cap_gib = 0;   // cap the GPU caching allocator (0: none)
  // Monitoring (docs/monitoring.md): --monitor_dir DIR turns on the tensorboard and csv_monitor
  // blocks, writing into DIR/gpt_train/; --wall_clock_breakdown turns on the engine's timers.
  std::string monitor_dir;
  bool wall_clock_breakdown = false;
};

// Parses gpt_train's flags (argv[0] first, after parse_args took --deepspeed_config); exits on
// --help or a parse error as CLI11 does; throws ConfigError naming the flags for a value that
// would do nothing or fail later without naming them: --steps < 1, --n_head < 1 or not dividing
// --n_embd, --pipeline_stages < -1, --tensor_parallel < 1, --vocab_size < 1 (below 256 without
// --random_tokens: text is bytes), --save_interval without --save_dir.
Options parse_options(const std::vector<std::string>& argv);

// Whether gpt_train saves a checkpoint after optimizer step `step`: every --save_interval steps,
// or with --save_dir alone once, after the last step (--steps).
bool saves_after(const Options& o, int64_t step);

// The micro-batches each data-parallel rank of a resumed pipeline job has consumed: the samples
// the checkpoint trained (Engine::global_samples, counted per step as train_batch_size) over this
// job's micro_batch x dp_size, rounded down (a layout that does not divide them trains the
// remainder again rather than skipping samples). The pipeline engine keeps no loader position of
// its own (docs/pipeline.md). REQUIRES: micro_batch > 0, dp_size > 0.
int64_t resumed_micro_batches(int64_t global_samples, int64_t micro_batch, int dp_size);

// The training data: --random_tokens windows, else --data's text.
std::shared_ptr<deepspeed::Dataset> make_dataset(const Options& opt);

// Peak resident set (VmHWM) of this process in kB, from /proc; 0 where unavailable.
long peak_rss_kb();

// What a Hugging Face Trainer would fill "auto" keys with (ConfigOverrides). fill_only: a value
// written in the config wins over the flags (the flags have defaults, and the example's configs
// set these keys explicitly).
deepspeed::ConfigOverrides trainer_values(const Options& o);

// The HF Trainer's optimizer when the config has none: AdamW (decoupled decay) over every
// trainable parameter once (a tied weight is one parameter), from --lr, --adam_beta1/2,
// --adam_epsilon, --weight_decay, with HF's groups: biases and LayerNorm parameters in a second
// group with weight decay 0 (gpt::hf_adamw). The engine takes both groups at every stage and
// precision, and under optimizer offload, where the AdamW runs as the CPU Adam (cpu, whole or
// range by range) or the swapped Adam (nvme) with one group per client group
// (zero/client_optimizer.h).
std::shared_ptr<torch::optim::Optimizer> make_adamw(torch::nn::Module& model, const Options& o);

// The config document with the monitoring flags applied on top: --monitor_dir DIR turns on the
// tensorboard and csv_monitor blocks (DIR/gpt_train/), --wall_clock_breakdown the engine's timers.
nlohmann::json with_monitoring(nlohmann::json doc, const Options& opt);

// "key=value, ..." of the config keys filled from the flags.
std::string filled_keys(const deepspeed::Config& config);

// OMP_NUM_THREADS, else 1.
int threads_from_env();

}  // namespace gpt_train
