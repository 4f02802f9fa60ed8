// Generation speed of the example GPT through deepspeed::init_inference (AutoTP), for
// bench/tp_inference.py (which runs it at tp 1, 2 and 4 beside PyTorch on the same weights).
//   bench_tp_inference --write_weights FILE [model flags]      writes seeded weights (safetensors)
//   dsrun --num_procs N bench_tp_inference --weights FILE --tensor_parallel N [--dtype bf16]
//         [model flags]
// Greedy decoding of a batch of random prompts with the kv-cache, after one warm-up generation:
// first-token latency is the prompt's forward and the pick of its first token; tokens/s counts
// the following tokens (batch x (new - 1)) over their time. Rank 0 prints one line
// "tp_inference tp=N first_token_ms=X decode_tokens_per_s=Y tokens=a,b,...;c,d,..." (every new
// token, the batch's rows split by ';').
// Every rank prints "tp_init_memory rank=R tp=N init=I base_rss_mib=A peak_rss_mib=B init_s=C":
// its resident set before building the model (libraries) and its high-water mark once
// init_inference has returned (VmHWM), and the seconds building + init_inference took. --init
// whole builds the model the ordinary way (every rank holds all of it first, then AutoTP keeps
// its slices); --init deferred (default) builds it under deepspeed::inference::DeferredInit.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>

#include "checkpoint/safetensors.h"
#include "deepspeed/args.h"
#include "deepspeed/comm.h"
#include "deepspeed/inference.h"
#include "gpt/model.h"

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}
// A /proc/self/status field in MiB (VmRSS: now, VmHWM: the high-water mark).
double status_mib(const std::string& field) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1)) / 1024.0;
  return -1;
}
// [batch, new] token ids as "a,b,...;c,d,...": rows split by ';' (tp_inference.py's token_text).
std::string token_text(const torch::Tensor& tokens) {
  auto t = tokens.to(torch::kLong).contiguous();
  std::string text;
  for (int64_t r = 0; r < t.size(0); ++r) {
    if (r > 0) text += ";";
    for (int64_t i = 0; i < t.size(1); ++i)
      text += (i > 0 ? "," : "") + std::to_string(t[r][i].item<int64_t>());
  }
  return text;
}
}  // namespace

int main(int argc, char** argv) try {
  gpt::GPTConfig model;
  model.n_layer = 4;
  model.n_head = 16;
  model.n_embd = 1024;
  model.block_size = 256;
  std::string weights, write_weights;
  int tensor_parallel = 1, batch = 1, prompt_len = 32, new_tokens = 64, reps = 3;
  std::string dtype = "fp32", init = "deferred";
  CLI::App app{"AutoTP generation benchmark"};
  app.add_option("--weights", weights);
  app.add_option("--write_weights", write_weights);
  app.add_option("--tensor_parallel", tensor_parallel);
  app.add_option("--batch", batch);
  app.add_option("--prompt_len", prompt_len);
  app.add_option("--new_tokens", new_tokens);
  app.add_option("--reps", reps, "timed generations (the best is reported)");
  app.add_option("--dtype", dtype, "fp32 or bf16: the weights and activations after loading")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--init", init, "deferred (default): build under inference::DeferredInit; whole")
      ->check(CLI::IsMember({"deferred", "whole"}));
  app.add_option("--n_layer", model.n_layer);
  app.add_option("--n_head", model.n_head);
  app.add_option("--n_embd", model.n_embd);
  app.add_option("--block_size", model.block_size);
  const auto args = deepspeed::parse_args(argc, argv);
  std::vector<const char*> rest;
  for (const auto& a : args.rest) rest.push_back(a.c_str());
  CLI11_PARSE(app, static_cast<int>(rest.size()), rest.data());
  torch::NoGradGuard no_grad;

  if (!write_weights.empty()) {
    torch::manual_seed(1);
    gpt::GPTImpl m(model);
    deepspeed::checkpoint::NamedTensors tensors;
    for (auto& p : m.named_parameters()) tensors.emplace_back(p.key(), p.value().detach());
    for (auto& b : m.named_buffers()) tensors.emplace_back(b.key(), b.value());
    deepspeed::checkpoint::write_safetensors(write_weights, tensors);
    std::printf("wrote %s (%lld parameters)\n", write_weights.c_str(),
                static_cast<long long>(m.num_parameters()));
    return 0;
  }
  auto comm = deepspeed::init_distributed();
  const double base_rss = status_mib("VmRSS");
  const auto t_init = Clock::now();
  std::shared_ptr<gpt::GPTImpl> net;
  if (init == "deferred") {
    deepspeed::inference::DeferredInit deferred;
    net = std::make_shared<gpt::GPTImpl>(model);
  } else {
    net = std::make_shared<gpt::GPTImpl>(model);
  }
  auto engine =
      deepspeed::init_inference(net, {.tp_size = tensor_parallel,
                                      .dtype = dtype == "bf16" ? at::kBFloat16 : at::kFloat,
                                      .checkpoint = weights,
                                      .comm = comm});
  std::printf(
      "tp_init_memory rank=%d tp=%d init=%s base_rss_mib=%.0f peak_rss_mib=%.0f init_s=%.2f\n",
      comm->rank(), tensor_parallel, init.c_str(), base_rss, status_mib("VmHWM"),
      ms_since(t_init) / 1e3);
  std::fflush(stdout);
  auto gen = at::detail::createCPUGenerator(7);
  const auto prompt = torch::randint(model.vocab_size, {batch, prompt_len}, gen, torch::kLong);

  double best_first = 1e30, best_rate = 0;
  // Every new token of every row ("1,2,...;4,5,..."): the driver checks PyTorch generates the same.
  std::string tokens;
  for (int r = 0; r <= reps; ++r) {  // r = 0: warm-up
    comm->barrier();
    gpt::KVCache cache;
    const auto t0 = Clock::now();
    auto next = net->logits_cached(prompt, cache).select(1, -1).argmax(-1).view({batch, 1});
    const double first = ms_since(t0);
    const auto t1 = Clock::now();
    std::vector<torch::Tensor> outs{next};  // kept as tensors: no conversion in the timed loop
    for (int i = 1; i < new_tokens; ++i) {
      next = net->logits_cached(next, cache).select(1, -1).argmax(-1).view({batch, 1});
      outs.push_back(next);
    }
    const double rate = batch * (new_tokens - 1) / (ms_since(t1) / 1e3);
    tokens = token_text(torch::cat(outs, 1));
    if (r > 0) {
      best_first = std::min(best_first, first);
      best_rate = std::max(best_rate, rate);
    }
  }
  if (comm->rank() == 0)
    std::printf(
        "tp_inference tp=%d dtype=%s first_token_ms=%.2f decode_tokens_per_s=%.1f tokens=%s\n",
        tensor_parallel, dtype.c_str(), best_first, best_rate, tokens.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_tp_inference: error: %s\n", e.what());
  return 1;
}
