// gpt_generate: continue a prompt with the example GPT trained by gpt_train.
//   gpt_generate --load_dir DIR --prompt TEXT [--max_new_tokens N] [--greedy | --top_k K --top_p P
//                --temperature T --seed S] [model flags as given to gpt_train: --n_layer ...]
// The model flags default to those gpt_train saved beside the checkpoint (<tag>/gpt_model.json,
// model_flags.h); one given that differs is refused. A checkpoint without that file (an older
// gpt_train, a weights file) takes the flags given, and refuses tensors the model would leave
// unread (gpt::check_no_leftovers).
// Reads the checkpoint DIR/latest names (any world size, ZeRO stage or pipeline layout) through
// deepspeed::init_inference, generates with a kv-cache, and prints the prompt and its
// continuation as its last line (bytes are tokens) on rank 0.
//   dsrun --num_procs N gpt_generate --tensor_parallel N ...   splits the blocks over N ranks
//   (AutoTP), each rank reading only its slices of the checkpoint. The model is built in
//   placeholder memory (deepspeed::inference::DeferredInit), so no rank ever holds all of it.
// --load_dir may also name a weights file: ds_to_fp32's or save_16bit_model's pytorch_model.bin
// (torch.save) or a .safetensors file.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <set>
#include <string>

#include "deepspeed/args.h"
#include "deepspeed/comm.h"
#include "deepspeed/errors.h"
#include "deepspeed/inference.h"
#include "gpt/generate.h"
#include "gpt/model_flags.h"
#include "gpt/tp_model.h"

int main(int argc, char** argv) try {
  std::string load_dir, tag, prompt;
  int64_t max_new_tokens = 64;
  gpt::GPTConfig model;
  gpt::SamplingOptions sampling;
  bool greedy = false;
  int tensor_parallel = 1;
  std::string dtype = "fp32";
  CLI::App app{"gpt_generate: continue a prompt with a GPT checkpoint of gpt_train", "gpt_generate"};
  app.add_option("--load_dir", load_dir, "checkpoint folder of gpt_train --save_dir")->required();
  app.add_option("--tag", tag, "checkpoint tag (default: the one DIR/latest names)");
  app.add_option("--prompt", prompt, "text to continue")->required();
  app.add_option("--max_new_tokens", max_new_tokens, "tokens (bytes) to generate (default 64)");
  app.add_flag("--greedy", greedy, "always the most likely token (default: sample)");
  app.add_option("--top_k", sampling.top_k, "sample among the K most likely tokens (0: all)");
  app.add_option("--top_p", sampling.top_p, "sample among the most likely tokens reaching P");
  app.add_option("--temperature", sampling.temperature, "divides the logits (default 1)");
  app.add_option("--seed", sampling.seed, "sampling seed (default 0)");
  app.add_option("--tensor_parallel", tensor_parallel,
                 "split the blocks over N ranks (run under dsrun with N processes)");
  app.add_option("--dtype", dtype, "fp32 (default) or bf16");
  app.add_option("--n_layer", model.n_layer);
  app.add_option("--n_head", model.n_head);
  app.add_option("--n_embd", model.n_embd);
  app.add_option("--block_size", model.block_size);
  app.add_option("--vocab_size", model.vocab_size, "gpt_train --random_tokens' vocabulary");
  app.add_flag("--no_bias{false}", model.bias, "Linear layers without bias");
  app.add_flag("--tie_embeddings", model.tie_embeddings, "the head is the token embedding");
  app.add_flag("--gelu_tanh", model.gelu_tanh, "tanh-approximated GELU");
  // dsrun appends --local_rank=K: parse_args takes it out, the rest goes to CLI11.
  const auto args = deepspeed::parse_args(argc, argv);
  std::vector<const char*> rest;
  for (const auto& a : args.rest) rest.push_back(a.c_str());
  CLI11_PARSE(app, static_cast<int>(rest.size()), rest.data());
  if (prompt.empty()) throw deepspeed::ConfigError("gpt_generate: --prompt is empty");
  if (max_new_tokens < 0)
    throw deepspeed::ConfigError("--max_new_tokens " + std::to_string(max_new_tokens) +
                                 " is negative");
  sampling.greedy = greedy;
  gpt::check_sampling(sampling, "--");

  if (dtype != "fp32" && dtype != "bf16")
    throw deepspeed::ConfigError("gpt_generate: --dtype " + dtype + " (fp32 or bf16)");
  std::set<std::string> given;
  for (const auto& flag : gpt::model_flag_names())
    if (app.count(flag) > 0) given.insert(flag);
  const std::string tag_dir = gpt::checkpoint_tag_dir(load_dir, tag);
  const auto saved = gpt::read_model_flags(tag_dir);
  model = gpt::resolve_model_flags(model, given, saved, tag_dir + "/" + gpt::kModelFlagsFile);
  // Before anything loads: generate() would refuse it only after the checkpoint is read, as a
  // torch error naming no flag. (The condition is generate()'s.)
  const int64_t prompt_tokens = static_cast<int64_t>(prompt.size());
  if (prompt_tokens + max_new_tokens > model.block_size)
    throw deepspeed::ConfigError(
        "--prompt of " + std::to_string(prompt_tokens) + " tokens + --max_new_tokens " +
        std::to_string(max_new_tokens) + " exceed the model's block_size " +
        std::to_string(model.block_size) + " (its positions): " +
        (prompt_tokens <= model.block_size
             ? "give --max_new_tokens " + std::to_string(model.block_size - prompt_tokens) +
                   " or fewer"
             : std::string("shorten --prompt")));
  for (unsigned char c : prompt)
    if (c >= model.vocab_size)
      throw deepspeed::ConfigError("gpt_generate: the prompt's byte " + std::to_string(c) +
                                   " is not a token of the model's vocabulary (vocab_size " +
                                   std::to_string(model.vocab_size) + ")");
  gpt::check_tensor_parallel(model, tensor_parallel, /*split_vocabulary=*/false);
  auto comm = deepspeed::init_distributed();
  gpt::GPT net{nullptr};
  {
    deepspeed::inference::DeferredInit deferred;  // init_inference allocates this rank's slices
    net = gpt::GPT(model);
  }
  // Without the saved flags nothing tells a smaller --n_layer, --tie_embeddings on an untied
  // checkpoint or --no_bias on a biased one: the tensors the model would leave unread do.
  if (!saved) gpt::check_no_leftovers(gpt::stored_tensor_names(load_dir, tag), *net, load_dir);
  deepspeed::InferenceConfig config;
  config.tp_size = tensor_parallel;
  config.head_dim = model.n_embd / model.n_head;  // heads split whole (checked above too)
  config.dtype = dtype == "bf16" ? torch::kBFloat16 : torch::kFloat;
  config.checkpoint = load_dir;
  config.tag = tag;
  config.checkpoint_names = [model](const std::string& n) { return gpt::checkpoint_names(n, model); };
  auto engine = deepspeed::init_inference(net.ptr(), config);
  std::vector<int64_t> tokens;
  for (unsigned char c : prompt) tokens.push_back(c);
  const auto out = gpt::generate(*net, {tokens}, max_new_tokens, sampling).front();
  std::string text = prompt;
  for (int64_t t : out) text.push_back(static_cast<char>(t));
  if (comm->rank() == 0) std::printf("%s\n", text.c_str());
  return 0;
} catch (const c10::Error& e) {
  // what() carries libtorch 1.13's C++ stack frames: the message alone.
  std::fprintf(stderr, "gpt_generate: error: %s\n", e.what_without_backtrace());
  return 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "gpt_generate: error: %s\n", e.what());
  return 1;
}
