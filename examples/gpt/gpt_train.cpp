// Trains the example GPT with deepspeed.cpp:
//   dsrun --num_procs 2 build/bin/gpt_train --deepspeed_config examples/gpt/ds_config.json
// Rank 0 prints "step <n> loss <x>" after each optimizer step, and a summary at the end.
// Checkpoints: --save_dir DIR --save_interval K saves DIR/global_step<N> every K steps;
// --load_dir DIR resumes from DIR/latest and continues the step count up to --steps.
// --tensor_parallel N splits the layers over groups of N consecutive ranks (gpt::TPGPT, built
// from the whole GPT of --seed on every rank; world = N x data-parallel ranks; no checkpoints yet).
// Like the Hugging Face Trainer, the training flags (--lr, --weight_decay, --adam_beta1/2,
// --adam_epsilon, --max_grad_norm, --warmup_steps, --micro_batch, --gradient_accumulation_steps,
// --fp16/--bf16; --steps and --n_embd) fill the config's "auto" keys, and with no "optimizer"
// block they build an AdamW; values written in the config win over the flags' defaults.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>

#include <CLI/CLI.hpp>

#include "deepspeed/deepspeed.h"
#include "gpt/model.h"
#include "gpt/progress.h"
#include "gpt/pipeline_model.h"
#include "gpt/text_dataset.h"
#include "gpt/tp_model.h"

namespace {

struct Options {
  std::string data = DS_DEFAULT_TEXT;
  int64_t steps = 100;
  gpt::GPTConfig model;
  int64_t stride = 0;  // 0: block_size / 2
  uint64_t seed = 1234;
  int threads = 0;     // 0: OMP_NUM_THREADS, else 1
  std::string save_dir;
  int64_t save_interval = 0;  // 0: no periodic saves
  int pipeline_stages = 0;    // > 0: the GPT as a PipelineModule, trained with train_batch
  int tensor_parallel = 1;    // > 1: gpt::TPGPT over groups of N consecutive ranks
  std::string load_dir;
  bool zero_init = false;  // build the model under deepspeed::zero::Init (ZeRO stage 3)
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

// Random token windows (what bench/gpu's peers train on): sample i is drawn from a generator
// seeded with i, so every rank and every run sees the same data for the same index.
class RandomTokens : public deepspeed::Dataset {
 public:
  RandomTokens(int64_t vocab, int64_t block_size, int64_t samples)
      : vocab_(vocab), block_size_(block_size), samples_(samples) {}
  int64_t size() const override { return samples_; }
  deepspeed::Sample get(int64_t index) const override {
    auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(index) + 1);
    auto seq = torch::randint(vocab_, {block_size_ + 1}, gen, torch::kLong);
    return {seq.narrow(0, 0, block_size_), seq.narrow(0, 1, block_size_)};
  }

 private:
  int64_t vocab_, block_size_, samples_;
};

Options parse_options(const std::vector<std::string>& argv) {
  Options o;
  CLI::App app{"Train the example GPT with deepspeed.cpp"};
  app.add_option("--data", o.data, "training text (bytes)");
  app.add_option("--steps", o.steps, "optimizer steps to run");
  app.add_option("--n_layer", o.model.n_layer);
  app.add_option("--n_head", o.model.n_head);
  app.add_option("--n_embd", o.model.n_embd);
  app.add_option("--block_size", o.model.block_size);
  app.add_option("--vocab_size", o.model.vocab_size, "with --random_tokens (text is bytes: 256)");
  app.add_flag("--no_bias{false}", o.model.bias, "Linear layers without bias");
  app.add_flag("--tie_embeddings", o.model.tie_embeddings, "the head is the token embedding");
  app.add_flag("--gelu_tanh", o.model.gelu_tanh, "tanh-approximated GELU");
  app.add_option("--dropout", o.model.dropout, "residual dropout probability (default 0)");
  app.add_flag("--activation_checkpointing", o.model.activation_checkpointing,
               "recompute each block's activations in backward instead of keeping them");
  app.add_option("--device", o.device, "auto (default), cpu, cuda, cuda:N");
  app.add_option("--pipeline_stages", o.pipeline_stages,
                 "pipeline parallelism: the GPT as a PipelineModule over N stages (0: off; "
                 "-1: the config's pipeline.stages)");
  app.add_option("--tensor_parallel", o.tensor_parallel,
                 "tensor parallelism: layers split over N consecutive ranks (world = N x data)");
  app.add_flag("--random_tokens", o.random_tokens, "train on random tokens instead of --data");
  app.add_option("--warmup", o.warmup, "optimizer steps left out of the timing (default 1)");
  app.add_option("--gpu_mem_cap_gib", o.gpu_mem_cap_gib, "cap the GPU memory the run may take");
  app.add_option("--monitor_dir", o.monitor_dir,
                 "write TensorBoard event files and CSV monitor files into DIR/gpt_train/");
  app.add_flag("--wall_clock_breakdown", o.wall_clock_breakdown,
               "print DeepSpeed's forward/backward/step timers every steps_per_print steps");
  app.add_option("--stride", o.stride, "bytes between training windows (default block_size/2)");
  app.add_option("--seed", o.seed, "model initialisation seed");
  app.add_option("--threads", o.threads, "intra-op threads per rank (default OMP_NUM_THREADS or 1)");
  app.add_option("--save_dir", o.save_dir, "checkpoint folder (saves every --save_interval steps)");
  app.add_option("--save_interval", o.save_interval, "optimizer steps between checkpoints");
  app.add_option("--load_dir", o.load_dir, "resume from the checkpoint named by DIR/latest");
  app.add_flag("--zero_init", o.zero_init,
               "ZeRO-3: build the model already partitioned (each block is split as it is built)");
  app.add_flag("--exact_loss", o.exact_loss,
               "print each step's loss also exactly (hex float), to compare runs bit for bit");
  const char* fills = " (fills \"auto\"; AdamW when the config has no optimizer block)";
  app.add_option("--lr", o.lr, std::string("learning rate") + fills);
  app.add_option("--weight_decay", o.weight_decay, std::string("AdamW weight decay") + fills);
  app.add_option("--adam_beta1", o.adam_beta1, std::string("AdamW beta1") + fills);
  app.add_option("--adam_beta2", o.adam_beta2, std::string("AdamW beta2") + fills);
  app.add_option("--adam_epsilon", o.adam_epsilon, std::string("AdamW eps") + fills);
  app.add_option("--max_grad_norm", o.max_grad_norm, "fills \"gradient_clipping\": \"auto\"");
  app.add_option("--warmup_steps", o.warmup_steps, "fills scheduler.params.warmup_num_steps \"auto\"");
  app.add_option("--micro_batch", o.micro_batch, "fills train_micro_batch_size_per_gpu \"auto\"");
  app.add_option("--gradient_accumulation_steps", o.gradient_accumulation_steps,
                 "fills gradient_accumulation_steps \"auto\"");
  app.add_flag("--fp16", o.fp16, "fills fp16.enabled \"auto\" (else false)");
  app.add_flag("--bf16", o.bf16, "fills bf16.enabled \"auto\" (else false)");
  std::vector<const char*> args;
  for (auto& a : argv) args.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
  if (o.stride <= 0) o.stride = std::max<int64_t>(1, o.model.block_size / 2);
  if (o.save_interval > 0 && o.save_dir.empty())
    throw deepspeed::ConfigError("gpt_train: --save_interval needs --save_dir");
  return o;
}

// Peak resident set (VmHWM) of this process in kB, from /proc; 0 where unavailable.
long peak_rss_kb() {
  std::ifstream status("/proc/self/status");
  std::string key;
  long value = 0;
  while (status >> key) {
    if (key == "VmHWM:") {
      status >> value;
      return value;
    }
    status.ignore(1 << 12, '\n');
  }
  return 0;
}

// What a Hugging Face Trainer would fill "auto" keys with (ConfigOverrides). fill_only: a value
// written in the config wins over the flags (the flags have defaults, and the example's configs
// set these keys explicitly).
deepspeed::ConfigOverrides trainer_values(const Options& o) {
  deepspeed::ConfigOverrides v;
  v.fill_only = true;
  v.train_micro_batch_size_per_gpu = o.micro_batch;
  v.gradient_accumulation_steps = o.gradient_accumulation_steps;
  v.learning_rate = o.lr;
  v.betas = std::make_pair(o.adam_beta1, o.adam_beta2);
  v.eps = o.adam_epsilon;
  v.weight_decay = o.weight_decay;
  v.gradient_clipping = o.max_grad_norm;
  v.fp16 = o.fp16;
  v.bf16 = o.bf16;
  v.warmup_steps = o.warmup_steps;
  v.total_steps = o.steps;
  v.hidden_size = o.model.n_embd;
  return v;
}

// The HF Trainer's optimizer when the config has none: AdamW (decoupled decay) over every
// trainable parameter once (a tied weight is one parameter).
std::shared_ptr<torch::optim::Optimizer> make_adamw(torch::nn::Module& model, const Options& o) {
  std::vector<torch::Tensor> params;
  std::set<const void*> seen;
  for (auto& p : model.parameters())
    if (p.requires_grad() && seen.insert(p.unsafeGetTensorImpl()).second) params.push_back(p);
  auto options = torch::optim::AdamWOptions(o.lr)
                     .betas(std::make_tuple(o.adam_beta1, o.adam_beta2))
                     .eps(o.adam_epsilon)
                     .weight_decay(o.weight_decay);
  return std::make_shared<torch::optim::AdamW>(std::move(params), options);
}

std::string filled_keys(const deepspeed::Config& config) {
  std::string out;
  for (const auto& [key, value] : config.auto_filled)
    out += (out.empty() ? "" : ", ") + key + "=" + value.dump();
  return out;
}

int threads_from_env() {
  const char* v = std::getenv("OMP_NUM_THREADS");
  return v ? std::max(1, std::atoi(v)) : 1;
}

// The stage count of --pipeline_stages: the flag's, or (-1) the config's pipeline.stages.
int pipeline_stage_count(const Options& opt, const std::string& config_path) {
  if (opt.pipeline_stages > 0) return opt.pipeline_stages;
  std::ifstream in(config_path);
  const auto raw = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false, /*comments=*/true);
  if (raw.is_object() && raw.contains("pipeline") && raw["pipeline"].contains("stages") &&
      raw["pipeline"]["stages"].is_number_integer())
    return raw["pipeline"]["stages"].get<int>();
  throw deepspeed::ConfigError("gpt_train: --pipeline_stages -1 needs a number in the config's "
                               "pipeline.stages (" + config_path + ")");
}

// --pipeline_stages: the GPT as a PipelineModule (embedding, blocks, final norm, head; the head
// tied to the embedding with --tie_embeddings), one train_batch() per optimizer step. The
// config's "pipeline" block (stages, partition, activation_checkpoint_interval) applies; the
// batch keys are per data-parallel rank (world / stages), and "auto" keys are filled from the
// flags as without the pipeline. Checkpoints (--save_dir, --load_dir) are the pipeline layout;
// the data position resumes from the step count (global_steps x accumulation micro-batches per
// data-parallel rank).
int train_pipeline(const Options& opt, const std::string& config_path,
                   const deepspeed::comm::CommunicatorPtr& comm,
                   const std::shared_ptr<deepspeed::Dataset>& data) {
  const int stages = pipeline_stage_count(opt, config_path);
  std::vector<std::string> warnings;  // initialize_pipeline() reports them
  const auto config = deepspeed::load_config(config_path, comm->world_size() / std::max(1, stages),
                                             trainer_values(opt), &warnings);
  deepspeed::pipe::PipelineInitializeArgs args;
  args.model = gpt::gpt_pipeline(opt.model);
  args.model.num_stages = stages;
  args.config_json = config.raw;
  args.comm = comm;
  args.device = opt.device;
  auto engine = deepspeed::pipe::initialize_pipeline(args);
  const int dp_size = comm->world_size() / stages, dp_rank = comm->rank() % dp_size;
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
    loader.load_state({consumed / loader.batches_per_epoch(), consumed % loader.batches_per_epoch()});
    if (comm->rank() == 0 && !loaded.load_path.empty())
      std::printf("gpt_train: resumed from %s at step %lld\n", loaded.load_path.c_str(),
                  static_cast<long long>(engine->global_steps()));
  }
  const bool rank0 = comm->rank() == 0;
  if (rank0)
    std::printf("gpt_train: pipeline %d stages x %d data-parallel, zero stage %d, micro batch "
                "%lld, accumulation %lld\n",
                stages, dp_size, engine->config().zero_optimization.stage,
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
    if (engine->global_steps() == first_step + opt.warmup) timed_from = std::chrono::steady_clock::now();
    if (opt.save_interval > 0 && engine->global_steps() % opt.save_interval == 0) {
      engine->save_checkpoint(opt.save_dir);
      if (rank0) std::printf("gpt_train: saved %s/global_step%lld\n", opt.save_dir.c_str(),
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
  std::printf("gpt_train_report rank=%d stage=%d step_ms=%.2f tokens_per_s=%.1f final_loss=%.5f "
              "peak_rss_kb=%ld max_activations_held=%d idle_fraction=%.4f step_fraction=%.4f\n",
              comm->rank(), engine->stage_id(), 1e3 * seconds / timed_steps,
              seconds > 0 ? tokens / seconds : 0.0, engine->last_loss(), peak_rss_kb(),
              engine->max_activations_held(),
              wall_s > step_s ? 1.0 - compute_s / (wall_s - step_s) : 0.0,
              wall_s > 0 ? step_s / wall_s : 0.0);
  return 0;
}

// The config as given, with the monitoring flags applied on top.
nlohmann::json with_monitoring(nlohmann::json doc, const Options& opt) {
  if (!opt.monitor_dir.empty()) {
    for (const char* block : {"tensorboard", "csv_monitor"})
      doc[block] = {{"enabled", true}, {"output_path", opt.monitor_dir}, {"job_name", "gpt_train"}};
  }
  if (opt.wall_clock_breakdown) doc["wall_clock_breakdown"] = true;
  return doc;
}

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

template <class Model>
int train(const Run& run, std::shared_ptr<Model> model) {
  const Options& opt = run.opt;
  const auto& config = run.config;
  const auto& comm = run.comm;
  const auto& data = run.data;
  const int64_t num_params = run.num_params;
  const bool rank0 = comm->rank() == 0;
  auto [engine, optimizer, loader, scheduler] = deepspeed::initialize<Model>(
      {.model = model,
       .config_json = with_monitoring(config.raw, opt),
       .training_data = data,
       .optimizer = run.client_optimizer,
       .device = opt.device,
       .topology = run.topology});
  if (rank0)
    std::printf("gpt_train: %lld parameters, %d ranks (%s), device %s, zero stage %d, micro batch "
                "%lld, accumulation %lld, %lld training windows of %lld tokens from %s\n",
                static_cast<long long>(num_params), comm->world_size(), comm->backend().c_str(),
                engine->device().str().c_str(), engine->config().zero_optimization.stage,
                static_cast<long long>(engine->train_micro_batch_size_per_gpu()),
                static_cast<long long>(engine->gradient_accumulation_steps()),
                static_cast<long long>(data->size()), static_cast<long long>(opt.model.block_size),
                opt.random_tokens ? "random tokens" : opt.data.c_str());

  if (!opt.load_dir.empty()) {
    auto loaded = engine->load_checkpoint(opt.load_dir);
    if (rank0 && !loaded.load_path.empty())
      std::printf("gpt_train: resumed from %s at step %lld\n", loaded.load_path.c_str(),
                  static_cast<long long>(engine->global_steps()));
  }

  const int64_t first_step = engine->global_steps();
  auto start = std::chrono::steady_clock::now();
  auto last_boundary = start;  // for the tokens/s event
  auto timed_from = start;  // the first step (allocation, warm-up) is left out of the averages
  gpt::ProgressLine progress(opt.steps, double(engine->train_batch_size()) * opt.model.block_size,
                             gpt::stdout_is_terminal());
  while (engine->global_steps() < opt.steps) {
    auto batch = loader->next();
    auto loss = engine->forward(batch.data, batch.target);
    engine->backward(loss);
    engine->step();
    if (engine->micro_steps() % engine->gradient_accumulation_steps() == 0) {
      if (rank0)
        progress.on_step(engine->global_steps(), engine->last_loss(), opt.exact_loss,
                         gpt::engine_prints_at(engine->config(), engine->global_steps() + 1));
      // The engine does not know what a token is; the example adds the event itself.
      const auto now = std::chrono::steady_clock::now();
      if (auto monitor = engine->monitor(); monitor->enabled()) {
        const double s = std::chrono::duration<double>(now - last_boundary).count();
        const double tokens = double(engine->train_batch_size()) * opt.model.block_size;
        if (s > 0)
          monitor->write_events({{"Train/Samples/tokens_per_second", tokens / s,
                                  engine->global_samples()}});
      }
      last_boundary = now;
      if (engine->global_steps() == first_step + opt.warmup) {
        timed_from = std::chrono::steady_clock::now();
        deepspeed::reset_device_memory_peaks(engine->device());
        engine->communicator()->reset_stats();  // comm_payload_bytes_per_step: timed steps only
      }
      if (opt.save_interval > 0 && engine->global_steps() % opt.save_interval == 0) {
        engine->save_checkpoint(opt.save_dir);
        if (rank0) std::printf("gpt_train: saved %s/global_step%lld\n", opt.save_dir.c_str(),
                               static_cast<long long>(engine->global_steps()));
      }
    }
  }
  auto end = std::chrono::steady_clock::now();
  progress.finish();
  double seconds = std::chrono::duration<double>(end - timed_from).count();
  // Steps 2..N are timed; with fewer than two steps run (a resume at or near --steps) there is
  // no timing to report, only the memory figures: rates print as 0.
  const int64_t steps_run = opt.steps - first_step;
  int64_t timed_steps = std::max<int64_t>(1, steps_run - opt.warmup);
  double tokens = double(timed_steps) * engine->train_batch_size() * opt.model.block_size;
  if (steps_run <= opt.warmup) seconds = tokens = 0.0;
  const double tokens_per_s = seconds > 0 ? tokens / seconds : 0.0;
  {
    // One machine-readable line per rank for bench/zero_memory_and_speed.py.
    auto mem = engine->memory_report();
    // Bytes handed to the data-parallel collectives per timed step (payload, not wire bytes).
    int64_t payload = 0;
    for (const auto& [op, st] : engine->communicator()->stats()) payload += st.bytes;
    std::printf("gpt_train_report rank=%d step_ms=%.2f tokens_per_s=%.1f final_loss=%.5f "
                "params_bytes=%lld grads_bytes=%lld optim_bytes=%lld comm_bytes=%lld "
                "model_state_bytes=%lld peak_rss_kb=%ld num_params=%lld gathered_peak_bytes=%lld "
                "gpu_allocated_peak=%lld gpu_reserved_peak=%lld comm_payload_bytes_per_step=%lld\n",
                comm->rank(), 1e3 * seconds / timed_steps, tokens_per_s, engine->last_loss(),
                static_cast<long long>(mem.parameters), static_cast<long long>(mem.gradients),
                static_cast<long long>(mem.optimizer_states), static_cast<long long>(mem.comm_buffers),
                static_cast<long long>(mem.model_states()), peak_rss_kb(),
                static_cast<long long>(num_params), static_cast<long long>(mem.peak_gathered_bytes),
                static_cast<long long>(deepspeed::device_memory(engine->device()).allocated_peak),
                static_cast<long long>(deepspeed::device_memory(engine->device()).reserved_peak),
                static_cast<long long>(steps_run > opt.warmup ? payload / timed_steps : 0));
  }
  if (rank0) {
    auto mem = engine->memory_report();
    std::printf("gpt_train: done %lld steps in %.1f s; %.1f ms/step, %.0f tokens/s (steps %lld..%lld); "
                "final loss %.4f; model-state bytes on rank 0: %.1f MB\n",
                static_cast<long long>(opt.steps),
                std::chrono::duration<double>(end - start).count(), 1e3 * seconds / timed_steps,
                tokens_per_s, static_cast<long long>(first_step + opt.warmup + 1),
                static_cast<long long>(opt.steps), engine->last_loss(), mem.model_states() / 1e6);
    if (engine->device().is_cuda()) {
      const auto gpu = deepspeed::device_memory(engine->device());
      std::printf("gpt_train: GPU memory peak %.2f GiB allocated, %.2f GiB reserved (of %.1f GiB)\n",
                  gpu.allocated_peak / 1073741824.0, gpu.reserved_peak / 1073741824.0,
                  gpu.total / 1073741824.0);
    }
    // activation_checkpointing.profile: the time spent recomputing (DeepSpeed logs it per call).
    if (deepspeed::checkpointing::options().profile)
      std::printf("gpt_train: %s\n", deepspeed::checkpointing::profile_summary().c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a killed run's log still has every finished line
  auto args = deepspeed::parse_args(argc, argv);
  auto opt = parse_options(args.rest);
  at::set_num_threads(opt.threads > 0 ? opt.threads : threads_from_env());
  if (args.config_path.empty()) throw deepspeed::ConfigError("gpt_train: --deepspeed_config FILE is required");

  deepspeed::comm::InitOptions init;
  init.config_path = args.config_path;  // its comm_timeout_seconds bounds every collective
  auto comm = deepspeed::init_distributed(init);
  torch::manual_seed(opt.seed);
  const c10::Device device = deepspeed::resolve_device(opt.device, comm->local_rank());
  if (opt.gpu_mem_cap_gib > 0)
    deepspeed::cap_device_memory(device, static_cast<int64_t>(opt.gpu_mem_cap_gib * (1LL << 30)));
  // The config is read once: its dtype is needed before the model is built (zero::Init keeps the
  // slices in it), and initialize() gets the parsed document, its "auto" keys filled from the
  // flags and the model as the Hugging Face Trainer fills them.
  const bool rank0 = comm->rank() == 0;
  if (opt.pipeline_stages != 0) {
    std::shared_ptr<deepspeed::Dataset> data;
    if (opt.random_tokens)
      data = std::make_shared<RandomTokens>(opt.model.vocab_size, opt.model.block_size, 1 << 20);
    else
      data = std::make_shared<gpt::TextDataset>(opt.data, opt.model.block_size, opt.stride);
    return train_pipeline(opt, args.config_path, comm, data);
  }
  // --tensor_parallel N: groups of N consecutive ranks split the layers; the batch keys count the
  // data-parallel ranks (world / N).
  std::shared_ptr<deepspeed::comm::Topology> topology;
  if (opt.tensor_parallel != 1) {
    gpt::check_tensor_parallel(opt.model, opt.tensor_parallel);
    if (opt.zero_init) throw deepspeed::ConfigError("gpt_train: --zero_init with --tensor_parallel");
    topology = std::make_shared<deepspeed::comm::Topology>(
        comm, deepspeed::comm::TopologySizes{1, opt.tensor_parallel});
  }
  std::vector<std::string> warnings;  // initialize() reports them
  const auto config = deepspeed::load_config(
      args.config_path, comm->world_size() / opt.tensor_parallel, trainer_values(opt), &warnings);
  std::shared_ptr<gpt::GPTImpl> model;
  {
    // A no-op scope unless --zero_init; the slices are kept in the dtype training will use.
    const auto dtype = config.bf16.enabled ? torch::kBFloat16
                       : config.fp16.enabled ? torch::kHalf
                                             : torch::kFloat;
    deepspeed::zero::Init partitioned(comm, opt.zero_init, dtype);
    model = std::make_shared<gpt::GPTImpl>(opt.model);
  }
  // Like the Hugging Face Trainer: with no "optimizer" block, AdamW from the command line.
  std::shared_ptr<torch::optim::Optimizer> client_optimizer;
  if (!config.optimizer) {
    client_optimizer = make_adamw(*model, opt);
    if (rank0)
      std::printf("gpt_train: the config has no \"optimizer\" block: training with AdamW from the "
                  "command line (--lr %g, --adam_beta1 %g, --adam_beta2 %g, --adam_epsilon %g, "
                  "--weight_decay %g), as the Hugging Face Trainer does\n",
                  opt.lr, opt.adam_beta1, opt.adam_beta2, opt.adam_epsilon, opt.weight_decay);
  }
  if (rank0 && !config.auto_filled.empty())
    std::printf("gpt_train: filled \"auto\" config keys from the command line and the model: %s\n",
                filled_keys(config).c_str());
  // Counted before initialize(): under --zero_init the blocks hold only this rank's slices.
  const int64_t num_params = deepspeed::count_parameters(*model);
  std::shared_ptr<deepspeed::Dataset> data;
  if (opt.random_tokens)
    data = std::make_shared<RandomTokens>(opt.model.vocab_size, opt.model.block_size, 1 << 20);
  else
    data = std::make_shared<gpt::TextDataset>(opt.data, opt.model.block_size, opt.stride);

  Run run{opt, config, comm, data, client_optimizer, num_params, topology};
  if (!topology) return train(run, model);
  // Tensor parallelism: every rank built the whole model from one seed and keeps its slices.
  auto split = std::make_shared<gpt::TPGPTImpl>(opt.model, topology->tensor_parallel());
  split->copy_from(*model);
  model.reset();
  if (client_optimizer) run.client_optimizer = make_adamw(*split, opt);
  return train(run, split);
} catch (const std::exception& e) {
  std::fprintf(stderr, "gpt_train: error: %s\n", e.what());
  return 1;
}
