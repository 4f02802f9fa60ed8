// gpt_generate: continue a prompt with the example GPT trained by gpt_train.
//   gpt_generate --load_dir DIR --prompt TEXT [--max_new_tokens N] [--greedy | --top_k K --top_p P
//                --temperature T --seed S] [model flags as given to gpt_train: --n_layer ...]
// Reads the checkpoint DIR/latest names (any world size or ZeRO stage), generates with a
// kv-cache, and prints the prompt and its continuation as its last line (bytes are tokens).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "deepspeed/errors.h"
#include "gpt/generate.h"

int main(int argc, char** argv) try {
  std::string load_dir, tag, prompt;
  int64_t max_new_tokens = 64;
  gpt::GPTConfig model;
  gpt::SamplingOptions sampling;
  bool greedy = false;
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
  app.add_option("--n_layer", model.n_layer);
  app.add_option("--n_head", model.n_head);
  app.add_option("--n_embd", model.n_embd);
  app.add_option("--block_size", model.block_size);
  app.add_flag("--no_bias{false}", model.bias, "Linear layers without bias");
  app.add_flag("--tie_embeddings", model.tie_embeddings, "the head is the token embedding");
  app.add_flag("--gelu_tanh", model.gelu_tanh, "tanh-approximated GELU");
  CLI11_PARSE(app, argc, argv);
  if (prompt.empty()) throw deepspeed::ConfigError("gpt_generate: --prompt is empty");
  sampling.greedy = greedy;

  gpt::GPT net(model);
  net->eval();
  gpt::load_weights(*net, load_dir, tag);
  std::vector<int64_t> tokens;
  for (unsigned char c : prompt) tokens.push_back(c);
  const auto out = gpt::generate(*net, {tokens}, max_new_tokens, sampling).front();
  std::string text = prompt;
  for (int64_t t : out) text.push_back(static_cast<char>(t));
  std::printf("%s\n", text.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "gpt_generate: error: %s\n", e.what());
  return 1;
}
