#include "gpt/train_loop.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "gpt/model_flags.h"
#include "gpt/progress.h"

namespace gpt_train {
namespace {

template <class Model>
int train_loop(const Run& run, std::shared_ptr<Model> model) {
  const Options& opt = run.opt;
  const auto& config = run.config;
  const auto& comm = run.comm;
  const auto& data = run.data;
  const int64_t num_params = run.num_params;
  const bool rank0 = comm->rank() == 0;
  auto [engine, optimizer, loader, scheduler] =
      deepspeed::initialize<Model>({.model = model,
                                    .config_json = with_monitoring(config.raw, opt),
                                    .training_data = data,
                                    .optimizer = run.client_optimizer,
                                    .device = opt.device,
                                    .topology = run.topology});
  if (rank0)
    std::printf(
        "gpt_train: %lld parameters, %d ranks (%s), device %s, zero stage %d, micro batch "
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
  auto timed_from = start;     // the first step (allocation, warm-up) is left out of the averages
  // The whole run's GPU peak, what torch.cuda.max_memory_allocated() reads in a peer that never
  // resets it (gpu-anchor's gpt_bench.py; bench/gpu/table.py compares the two). The allocator's
  // own peak is reset after the warm-up below, and by the engine's memory report after step 1
  // (and every steps_per_print with memory_breakdown), as DeepSpeed's see_memory_usage does: so
  // it is read before each engine->step() (the report runs at its end) and before the reset. What
  // a step() does after its last read, the optimizer phase, repeats in the later steps, whose
  // peaks are read too.
  // The reserved peak likewise (the peers' max_memory_reserved(): what the caching allocator
  // took from the GPU, fragmentation included).
  int64_t gpu_peak_total = 0, gpu_reserved_peak_total = 0;
  const c10::Device device = engine->device();  // (a lambda cannot capture a structured binding)
  const auto note_gpu_peak = [&gpu_peak_total, &gpu_reserved_peak_total, device] {
    const auto now = deepspeed::device_memory(device);
    gpu_peak_total = std::max(gpu_peak_total, now.allocated_peak);
    gpu_reserved_peak_total = std::max(gpu_reserved_peak_total, now.reserved_peak);
  };
  const double tokens_per_step = double(engine->train_batch_size()) * opt.model.block_size;
  // The timed steps start and end with nothing in flight: no kernel queued on the GPU, no update
  // running on into the next forward (offload_optimizer.overlap_forward). Else the window would
  // count whatever was in flight at its end as done (or the warm-up's as timed).
  const auto quiesce = [&engine, device] {
    engine->complete_step();
    deepspeed::synchronize_device(device);
  };
  gpt::ProgressLine progress(opt.steps, tokens_per_step, gpt::stdout_is_terminal());
  gpt::TokensPerSecondEvent tokens_event(tokens_per_step);
  while (engine->global_steps() < opt.steps) {
    auto batch = loader->next();
    auto loss = engine->forward(batch.data, batch.target);
    engine->backward(loss);
    note_gpu_peak();
    engine->step();
    if (engine->micro_steps() % engine->gradient_accumulation_steps() == 0) {
      if (rank0)
        progress.on_step(engine->global_steps(), engine->last_loss(), opt.exact_loss,
                         gpt::engine_prints_at(engine->config(), engine->global_steps() + 1));
      tokens_event.on_step(*engine);
      if (engine->global_steps() == first_step + opt.warmup) {
        quiesce();
        timed_from = std::chrono::steady_clock::now();
        note_gpu_peak();
        deepspeed::reset_device_memory_peaks(engine->device());
        engine->communicator()->reset_stats();  // comm_payload_bytes_per_step: timed steps only
      }
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
  }
  quiesce();
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
    const auto gpu = deepspeed::device_memory(engine->device());
    note_gpu_peak();
    // Bytes handed to the data-parallel collectives per timed step (payload, not wire bytes).
    int64_t payload = 0;
    for (const auto& [op, st] : engine->communicator()->stats()) payload += st.bytes;
    std::printf(
        "gpt_train_report rank=%d step_ms=%.2f tokens_per_s=%.1f final_loss=%.5f "
        "params_bytes=%lld grads_bytes=%lld optim_bytes=%lld comm_bytes=%lld "
        "model_state_bytes=%lld peak_rss_kb=%ld num_params=%lld gathered_peak_bytes=%lld "
        "gpu_allocated_peak=%lld gpu_reserved_peak=%lld comm_payload_bytes_per_step=%lld "
        "host_state_bytes=%lld gpu_allocated_peak_total=%lld gpu_reserved_peak_total=%lld\n",
        comm->rank(), 1e3 * seconds / timed_steps, tokens_per_s, engine->last_loss(),
        static_cast<long long>(mem.parameters), static_cast<long long>(mem.gradients),
        static_cast<long long>(mem.optimizer_states), static_cast<long long>(mem.comm_buffers),
        static_cast<long long>(mem.model_states()), peak_rss_kb(),
        static_cast<long long>(num_params), static_cast<long long>(mem.peak_gathered_bytes),
        static_cast<long long>(gpu.allocated_peak), static_cast<long long>(gpu.reserved_peak),
        static_cast<long long>(steps_run > opt.warmup ? payload / timed_steps : 0),
        static_cast<long long>(mem.host_bytes),
        static_cast<long long>(gpu_peak_total), static_cast<long long>(gpu_reserved_peak_total));
  }
  if (rank0) {
    auto mem = engine->memory_report();
    std::printf(
        "gpt_train: done %lld steps in %.1f s; %.1f ms/step, %.0f tokens/s (steps %lld..%lld); "
        "final loss %.4f; model-state bytes on rank 0: %.1f MB\n",
        static_cast<long long>(opt.steps), std::chrono::duration<double>(end - start).count(),
        1e3 * seconds / timed_steps, tokens_per_s,
        static_cast<long long>(first_step + opt.warmup + 1), static_cast<long long>(opt.steps),
        engine->last_loss(), mem.model_states() / 1e6);
    if (engine->device().is_cuda()) {
      const auto gpu = deepspeed::device_memory(engine->device());
      std::printf(
          "gpt_train: GPU memory peak %.2f GiB allocated, %.2f GiB reserved (of %.1f GiB) over "
          "the timed steps, %.2f GiB allocated over the whole run; ZeRO states %.2f GiB on the "
          "GPU, %.2f GiB in host memory\n",
          gpu.allocated_peak / 1073741824.0, gpu.reserved_peak / 1073741824.0,
          gpu.total / 1073741824.0,
          gpu_peak_total / 1073741824.0,
          mem.device_bytes() / 1073741824.0, mem.host_bytes / 1073741824.0);
    }
    // activation_checkpointing.profile: the time spent recomputing (DeepSpeed logs it per call).
    if (deepspeed::checkpointing::options().profile)
      std::printf("gpt_train: %s\n", deepspeed::checkpointing::profile_summary().c_str());
  }
  return 0;
}

}  // namespace

std::pair<Run, std::shared_ptr<gpt::GPTImpl>> prepare_run(
    const Options& opt, const std::string& config_path,
    const deepspeed::comm::CommunicatorPtr& comm, int data_parallel_divisor) {
  const bool rank0 = comm->rank() == 0;
  std::vector<std::string> warnings;  // initialize() reports them
  const auto config = deepspeed::load_config(
      config_path, comm->world_size() / data_parallel_divisor, trainer_values(opt), &warnings);
  std::shared_ptr<gpt::GPTImpl> model;
  {
    // A no-op scope unless --zero_init; the slices are kept in the dtype training will use.
    const auto dtype = config.bf16.enabled   ? torch::kBFloat16
                       : config.fp16.enabled ? torch::kHalf
                                             : torch::kFloat;
    deepspeed::zero::Init partitioned(comm, opt.zero_init, dtype);
    model = std::make_shared<gpt::GPTImpl>(opt.model);
  }
  // Like the Hugging Face Trainer: with no "optimizer" block, AdamW from the command line.
  std::shared_ptr<torch::optim::Optimizer> client_optimizer;
  if (!config.optimizer) {
    // HF exempts biases and LayerNorm parameters from weight decay (a second parameter group).
    client_optimizer = make_adamw(*model, opt);
    if (rank0)
      std::printf(
          "gpt_train: the config has no \"optimizer\" block: training with AdamW from the "
          "command line (--lr %g, --adam_beta1 %g, --adam_beta2 %g, --adam_epsilon %g, "
          "--weight_decay %g; biases and LayerNorm weights without weight decay), as the "
          "Hugging Face Trainer does\n",
          opt.lr, opt.adam_beta1, opt.adam_beta2, opt.adam_epsilon, opt.weight_decay);
  }
  if (rank0 && !config.auto_filled.empty())
    std::printf("gpt_train: filled \"auto\" config keys from the command line and the model: %s\n",
                filled_keys(config).c_str());
  // Counted before initialize(): under --zero_init the blocks hold only this rank's slices.
  const int64_t num_params = deepspeed::count_parameters(*model);
  Run run{opt, config, comm, make_dataset(opt), client_optimizer, num_params, nullptr};
  return {run, model};
}

int train(const Run& run, std::shared_ptr<gpt::GPTImpl> model) { return train_loop(run, model); }
int train(const Run& run, std::shared_ptr<gpt::TPGPTImpl> model) { return train_loop(run, model); }

}  // namespace gpt_train
