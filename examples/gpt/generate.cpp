#include "gpt/generate.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "deepspeed/errors.h"
#include "deepspeed/zero_to_fp32.h"

namespace gpt {
namespace {

// The next token of each row from its last-position logits [B, vocab].
torch::Tensor pick(const torch::Tensor& logits, const SamplingOptions& o, at::Generator& gen) {
  if (o.greedy) return logits.argmax(-1);
  auto scores = logits.to(torch::kFloat) / o.temperature;
  if (o.top_k > 0 && o.top_k < scores.size(-1)) {
    auto kth = std::get<0>(scores.topk(o.top_k, -1)).select(-1, o.top_k - 1).unsqueeze(-1);
    scores = scores.masked_fill(scores < kth, -std::numeric_limits<float>::infinity());
  }
  if (o.top_p < 1.0) {
    // Nucleus: drop a token when the tokens more likely than it already reach top_p.
    auto [sorted, order] = scores.sort(-1, /*descending=*/true);
    auto before = sorted.softmax(-1).cumsum(-1) - sorted.softmax(-1);
    auto drop_sorted = before >= o.top_p;
    // The most likely token always stays (HF's min_tokens_to_keep = 1): with top_p 0 every
    // token would be dropped, and sampling from nothing fails.
    drop_sorted.select(-1, 0).fill_(false);
    auto drop = torch::zeros_like(drop_sorted).scatter(-1, order, drop_sorted);
    scores = scores.masked_fill(drop, -std::numeric_limits<float>::infinity());
  }
  return torch::multinomial(scores.softmax(-1), 1, /*replacement=*/false, gen).squeeze(-1);
}

}  // namespace

void check_sampling(const SamplingOptions& o, const std::string& prefix) {
  if (o.top_k < 0)
    throw deepspeed::ConfigError(prefix + "top_k " + std::to_string(o.top_k) +
                                 " is negative (0 keeps every token)");
  if (!(o.top_p >= 0.0 && o.top_p <= 1.0))
    throw deepspeed::ConfigError(prefix + "top_p " + c10::str(o.top_p) +
                                 " is outside [0, 1] (1 keeps every token)");
  if (!(o.temperature > 0.0) || !std::isfinite(o.temperature))
    throw deepspeed::ConfigError(prefix + "temperature " + c10::str(o.temperature) +
                                 " is not a strictly positive number (for the most likely token "
                                 "every time, use greedy)");
}

std::vector<std::vector<int64_t>> generate(GPTImpl& model,
                                           const std::vector<std::vector<int64_t>>& prompts,
                                           int64_t max_new_tokens, const SamplingOptions& o,
                                           bool use_cache) {
  check_sampling(o);
  torch::NoGradGuard no_grad;
  const int64_t B = static_cast<int64_t>(prompts.size());
  int64_t longest = 0;
  for (const auto& p : prompts) {
    TORCH_CHECK(!p.empty(), "generate: an empty prompt");
    longest = std::max<int64_t>(longest, static_cast<int64_t>(p.size()));
  }
  TORCH_CHECK(longest + max_new_tokens <= model.config().block_size, "generate: a prompt of ",
              longest, " tokens + ", max_new_tokens, " new ones exceeds block_size ",
              model.config().block_size);
  const auto device = model.parameters().front().device();
  // Left padding (token 0, masked) so every row's last prompt token is in the last column.
  torch::Tensor tokens = torch::zeros({B, longest}, torch::kLong);
  torch::Tensor pad = torch::empty({B}, torch::kLong);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = static_cast<int64_t>(prompts[b].size());
    pad[b] = longest - n;
    tokens[b].narrow(0, longest - n, n).copy_(torch::tensor(prompts[b], torch::kLong));
  }
  tokens = tokens.to(device);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  std::vector<std::vector<int64_t>> out(B);
  KVCache cache;
  cache.pad = pad;
  torch::Tensor step_input = tokens;  // the whole prompt first, then one token per step
  for (int64_t t = 0; t < max_new_tokens; ++t) {
    torch::Tensor logits;
    if (use_cache) {
      logits = model.logits_cached(step_input, cache);
    } else {
      KVCache fresh;  // the whole context again, through the same masked attention
      fresh.pad = pad;
      logits = model.logits_cached(tokens, fresh);
    }
    auto next = pick(logits.select(1, logits.size(1) - 1).to(torch::kCPU), o, gen);
    for (int64_t b = 0; b < B; ++b) out[b].push_back(next[b].item<int64_t>());
    step_input = next.view({B, 1}).to(device);
    tokens = torch::cat({tokens, step_input}, 1);
  }
  return out;
}

std::vector<std::string> checkpoint_names(const std::string& name, const GPTConfig& c) {
  // gpt_pipeline's layers: 0 the embeddings (tied: "tied_embed."), 1..n_layer the blocks,
  // n_layer + 1 the final LayerNorm, n_layer + 2 the head.
  auto layer = [](int64_t i) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "layer_%02lld.", static_cast<long long>(i));
    return std::string(buf);
  };
  auto starts = [&](const char* prefix) { return name.rfind(prefix, 0) == 0; };
  const auto dot = name.find('.');
  const std::string rest = dot == std::string::npos ? name : name.substr(dot + 1);
  std::string piped;
  if (starts("wte.") || starts("wpe.")) {
    piped = (c.tie_embeddings ? std::string("tied_embed.") : layer(0)) + name;
  } else if (starts("block")) {
    piped = layer(std::stoll(name.substr(5, dot - 5)) + 1) + rest;
  } else if (starts("ln_f.")) {
    piped = layer(c.n_layer + 1) + rest;
  } else if (starts("head.")) {
    piped = layer(c.n_layer + 2) + rest;
  }
  return piped.empty() ? std::vector<std::string>{name} : std::vector<std::string>{name, piped};
}

void check_no_leftovers(const std::vector<std::string>& stored, const GPTImpl& model,
                        const std::string& where) {
  std::set<std::string> read;
  auto add = [&](const std::string& name) {
    for (auto& n : checkpoint_names(name, model.config())) read.insert(std::move(n));
  };
  for (const auto& item : model.named_parameters()) add(item.key());
  for (const auto& item : model.named_buffers()) add(item.key());
  for (const auto& name : stored)
    if (!read.count(name))
      throw deepspeed::CheckpointError(
          "checkpoint '" + where + "' has tensor \"" + name +
          "\" that this model does not have: it was saved from another model (a larger "
          "--n_layer, an untied head for --tie_embeddings, biases for --no_bias?)");
}

void load_weights(GPTImpl& model, const std::string& load_dir, const std::string& tag) {
  const std::string dir = load_dir + (tag.empty() ? "" : "/" + tag);
  std::map<std::string, at::Tensor> saved;
  for (auto& [name, t] : deepspeed::get_fp32_state_dict_from_zero_checkpoint(load_dir, tag))
    saved[name] = t;
  torch::NoGradGuard no_grad;
  auto fill = [&](const std::string& name, at::Tensor dst) {
    auto it = saved.end();
    for (const auto& candidate : checkpoint_names(name, model.config()))
      if (it == saved.end()) it = saved.find(candidate);
    if (it == saved.end())
      throw deepspeed::CheckpointError("checkpoint '" + dir + "' has no tensor \"" + name +
                                       "\": was it saved from this model (--n_layer, "
                                       "--tie_embeddings, ...)?");
    if (it->second.sizes() != dst.sizes())
      throw deepspeed::CheckpointError("checkpoint '" + dir + "': tensor \"" + it->first +
                                       "\" has shape " + c10::str(it->second.sizes()) +
                                       ", the model's is " + c10::str(dst.sizes()) +
                                       " (other --n_embd / --n_head / --block_size?)");
    dst.copy_(it->second);
  };
  std::vector<std::string> names;
  for (const auto& [name, t] : saved) names.push_back(name);
  check_no_leftovers(names, model, dir);
  for (auto& item : model.named_parameters()) fill(item.key(), item.value());
  for (auto& item : model.named_buffers()) fill(item.key(), item.value());
}

}  // namespace gpt
