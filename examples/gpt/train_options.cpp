#include "gpt/train_options.h"

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <fstream>

#include "gpt/hf_adamw.h"
#include "gpt/text_dataset.h"

namespace gpt_train {
namespace {

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

// What parse_options refuses once the flags are read (its header lists them).
void check_options(const Options& o) {
  // (main prints "gpt_train: error: " before the message.)
  auto refuse = [](const std::string& what) { throw deepspeed::ConfigError(what); };
  auto flag = [](const char* name, int64_t value) {
    return std::string(name) + " " + std::to_string(value);
  };
  if (o.steps < 1) refuse(flag("--steps", o.steps) + ": the optimizer steps to run must be >= 1");
  const gpt::GPTConfig& m = o.model;
  // The attention splits the width into n_head heads of n_embd / n_head (model.cpp would stop
  // with a torch error naming no flag; n_head 0 would divide by zero).
  if (m.n_head < 1 || m.n_embd % m.n_head != 0)
    refuse(flag("--n_embd", m.n_embd) + " is not divisible by " + flag("--n_head", m.n_head) +
           " (each head is n_embd / n_head wide)");
  if (o.pipeline_stages < -1)
    refuse(flag("--pipeline_stages", o.pipeline_stages) +
           ": give N >= 1 stages, 0 (no pipeline) or -1 (the config's pipeline.stages)");
  if (o.tensor_parallel < 1)
    refuse(flag("--tensor_parallel", o.tensor_parallel) + ": must be >= 1 (1: no split)");
  if (m.vocab_size < 1) refuse(flag("--vocab_size", m.vocab_size) + ": must be >= 1");
  // Text is read as bytes: tokens up to 255 index the embedding.
  if (!o.random_tokens && m.vocab_size < 256)
    refuse(flag("--vocab_size", m.vocab_size) + " with text (--data): its tokens are bytes, "
           "0..255, so the vocabulary must be >= 256 (a smaller one is for --random_tokens)");
  if (o.save_interval < 0) refuse(flag("--save_interval", o.save_interval) + ": must be >= 0");
  if (o.save_interval > 0 && o.save_dir.empty())
    refuse("--save_interval needs --save_dir");
}

}  // namespace

Options parse_options(const std::vector<std::string>& argv) {
  Options o;
  CLI::App app{"Train the example GPT with deepspeed.cpp"};
  // deepspeed::parse_args took --deepspeed_config and --local_rank out of argv before this
  // parser runs, so the option below never receives a value: it is here so that --help lists
  // the flag gpt_train requires.
  std::string config_shown_in_help;
  app.add_option("--deepspeed_config", config_shown_in_help,
                 "the DeepSpeed config, JSON or hjson (required; alias --deepscale_config)")
      ->option_text("FILE");
  app.footer(
      "--local_rank K (appended by dsrun and DeepSpeed's launchers) is accepted; the "
      "local rank is read from the launcher's environment (LOCAL_RANK and the like).");
  app.add_option("--data", o.data, "training text (bytes)");
  app.add_option("--steps", o.steps, "optimizer steps to run");
  app.add_option("--n_layer", o.model.n_layer);
  app.add_option("--n_head", o.model.n_head);
  app.add_option("--n_embd", o.model.n_embd);
  app.add_option("--block_size", o.model.block_size);
  app.add_option("--vocab_size", o.model.vocab_size,
                 "with --random_tokens (text is bytes: at least 256)");
  app.add_flag("--no_bias{false}", o.model.bias, "Linear layers without bias");
  app.add_flag("--tie_embeddings", o.model.tie_embeddings, "the head is the token embedding");
  app.add_flag("--gelu_tanh", o.model.gelu_tanh, "tanh-approximated GELU");
  app.add_option("--dropout", o.model.dropout, "residual dropout probability (default 0)");
  app.add_flag("--scaled_residual_init", o.model.scaled_residual_init,
               "GPT-2's init of the residual projections (attention and MLP proj): std 0.02 / "
               "sqrt(2 * n_layer) instead of 0.02 (bench/gpu's peers)");
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
  app.add_option("--stride", o.stride, "bytes between training windows (0, the default: block_size/2)");
  app.add_option("--seed", o.seed, "model initialisation seed");
  app.add_option("--threads", o.threads,
                 "intra-op threads per rank (default OMP_NUM_THREADS or 1)");
  app.add_option("--save_dir", o.save_dir,
                 "checkpoint folder (saves every --save_interval steps; without it, once after "
                 "the last step)");
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
  app.add_option("--warmup_steps", o.warmup_steps,
                 "fills scheduler.params.warmup_num_steps \"auto\"");
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
  if (o.stride < 0)
    throw deepspeed::ConfigError("--stride " + std::to_string(o.stride) +
                                 ": must be >= 1 (bytes between windows), or 0 for block_size / 2");
  if (o.stride == 0) o.stride = std::max<int64_t>(1, o.model.block_size / 2);
  check_options(o);
  return o;
}

bool saves_after(const Options& o, int64_t step) {
  if (o.save_interval > 0) return step % o.save_interval == 0;
  return !o.save_dir.empty() && step == o.steps;
}

int64_t resumed_micro_batches(int64_t global_samples, int64_t micro_batch, int dp_size) {
  return global_samples / (micro_batch * dp_size);
}

std::shared_ptr<deepspeed::Dataset> make_dataset(const Options& opt) {
  if (opt.random_tokens)
    return std::make_shared<RandomTokens>(opt.model.vocab_size, opt.model.block_size, 1 << 20);
  return std::make_shared<gpt::TextDataset>(opt.data, opt.model.block_size, opt.stride);
}

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

std::shared_ptr<torch::optim::Optimizer> make_adamw(torch::nn::Module& model, const Options& o) {
  auto options = torch::optim::AdamWOptions(o.lr)
                     .betas(std::make_tuple(o.adam_beta1, o.adam_beta2))
                     .eps(o.adam_epsilon)
                     .weight_decay(o.weight_decay);
  return gpt::hf_adamw(model, options, /*exempt_bias_and_norm=*/true);
}

nlohmann::json with_monitoring(nlohmann::json doc, const Options& opt) {
  if (!opt.monitor_dir.empty()) {
    for (const char* block : {"tensorboard", "csv_monitor"})
      doc[block] = {{"enabled", true}, {"output_path", opt.monitor_dir}, {"job_name", "gpt_train"}};
  }
  if (opt.wall_clock_breakdown) doc["wall_clock_breakdown"] = true;
  return doc;
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

}  // namespace gpt_train
