// Generation with the example GPT (examples/gpt/generate.*): the kv-cache gives the tokens a full
// recomputation gives; a left-padded batch of prompts of different lengths gives what each prompt
// gives alone; sampling is reproducible by seed and top_k = 1 / a tiny top_p reduce to greedy;
// and gpt_generate continues a prompt from a checkpoint gpt_train wrote.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>

#include "deepspeed/errors.h"
#include "gpt/generate.h"
#include "support/commands.h"
#include "support/files.h"
#include "support/ranks.h"

namespace {

gpt::GPT small_model(bool tied = false) {
  gpt::GPTConfig c;
  c.vocab_size = 256;
  c.block_size = 32;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  c.tie_embeddings = tied;
  torch::manual_seed(11);
  gpt::GPT m(c);
  m->eval();
  return m;
}

const std::vector<std::vector<int64_t>> kPrompts = {{72}, {72, 101, 108, 108, 111}, {1, 2, 3, 4, 5, 6, 7, 8, 9}};

}  // namespace

TEST(GptGenerate, CacheGivesTheTokensOfFullRecomputation) {
  for (bool tied : {false, true}) {
    auto m = small_model(tied);
    gpt::SamplingOptions greedy;
    auto cached = gpt::generate(*m, kPrompts, 12, greedy, /*use_cache=*/true);
    auto full = gpt::generate(*m, kPrompts, 12, greedy, /*use_cache=*/false);
    EXPECT_EQ(cached, full) << "tied " << tied;
    // And the cached logits equal the training path's (logits of the whole sequence).
    torch::NoGradGuard no_grad;
    auto idx = torch::tensor(kPrompts[2], torch::kLong).view({1, -1});
    gpt::KVCache cache;
    auto a = m->logits_cached(idx.narrow(1, 0, 4), cache);
    auto b = m->logits_cached(idx.narrow(1, 4, 5), cache);
    auto whole = m->logits(idx);
    EXPECT_TRUE(torch::allclose(torch::cat({a, b}, 1), whole, 1e-5, 1e-5));
  }
}

TEST(GptGenerate, PaddedBatchEqualsEachPromptAlone) {
  auto m = small_model();
  gpt::SamplingOptions greedy;
  auto batch = gpt::generate(*m, kPrompts, 10, greedy);
  ASSERT_EQ(batch.size(), kPrompts.size());
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    auto alone = gpt::generate(*m, {kPrompts[i]}, 10, greedy);
    EXPECT_EQ(batch[i], alone[0]) << "prompt " << i;
  }
  // The masking matters: an untrained model still gives different continuations to different
  // prompts, so equal rows would hide a bug.
  EXPECT_NE(batch[0], batch[2]);
}

TEST(GptGenerate, SamplingIsReproducibleAndReducesToGreedy) {
  auto m = small_model();
  gpt::SamplingOptions s;
  s.greedy = false;
  s.seed = 7;
  s.top_k = 20;
  s.top_p = 0.9;
  auto a = gpt::generate(*m, kPrompts, 16, s), b = gpt::generate(*m, kPrompts, 16, s);
  EXPECT_EQ(a, b);
  s.seed = 8;
  EXPECT_NE(gpt::generate(*m, kPrompts, 16, s), a);
  gpt::SamplingOptions greedy;
  const auto want = gpt::generate(*m, kPrompts, 16, greedy);
  gpt::SamplingOptions k1;
  k1.greedy = false;
  k1.top_k = 1;
  EXPECT_EQ(gpt::generate(*m, kPrompts, 16, k1), want);
  gpt::SamplingOptions p0;
  p0.greedy = false;
  p0.top_p = 1e-9;
  EXPECT_EQ(gpt::generate(*m, kPrompts, 16, p0), want);
}

TEST(GptGenerate, BadInputIsNamed) {
  auto m = small_model();
  gpt::SamplingOptions greedy;
  EXPECT_THROW(gpt::generate(*m, {{}}, 4, greedy), c10::Error);
  try {
    gpt::generate(*m, {std::vector<int64_t>(30, 1)}, 5, greedy);
    FAIL() << "no error for 35 positions with block_size 32";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds block_size 32"), std::string::npos) << e.what();
  }
}

// gpt_train (2 ranks, ZeRO-2) saves; gpt_generate continues a prompt from that checkpoint and
// prints it as its last line; a model of another width is refused naming the tensor.
TEST(GptGenerate, ContinuesAPromptFromAGptTrainCheckpoint) {
  dstest::TempDir dir("gpt_generate");
  std::ofstream(dir / "ds_config.json")
      << R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
             "steps_per_print": 0, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
             "zero_optimization": {"stage": 2}})";
  const std::string bin = dstest::bin_dir(), model = " --n_layer 2 --n_head 2 --n_embd 32 --block_size 32";
  const std::string train = dstest::dsrun_command(
      2, "gpt_train --deepspeed_config " + (dir / "ds_config.json") + model +
             " --steps 40 --save_dir " + (dir / "ck") + " --save_interval 40",
      dir / "train.log");
  ASSERT_EQ(std::system(train.c_str()), 0) << dstest::read_bytes(dir / "train.log");
  const std::string gen = bin + "/gpt_generate --load_dir " + (dir / "ck") + model +
                          " --prompt 'The ' --max_new_tokens 20 --greedy > " + (dir / "gen.log") +
                          " 2>&1";
  ASSERT_EQ(std::system(gen.c_str()), 0) << dstest::read_bytes(dir / "gen.log");
  std::string out = dstest::read_bytes(dir / "gen.log");
  while (!out.empty() && out.back() == '\n') out.pop_back();
  const std::string last = out.substr(out.rfind('\n') == std::string::npos ? 0 : out.rfind('\n') + 1);
  ASSERT_EQ(last.rfind("The ", 0), 0u) << out;
  EXPECT_EQ(last.size(), 4u + 20u) << out;
  // 40 steps on English text: the continuation is text (printable ASCII), not arbitrary bytes.
  for (unsigned char c : last.substr(4)) EXPECT_TRUE(c >= 32 && c < 127) << int(c) << " in " << last;
  const std::string wrong = bin + "/gpt_generate --load_dir " + (dir / "ck") +
                            " --n_layer 2 --n_head 2 --n_embd 64 --block_size 32 --prompt x > " +
                            (dir / "wrong.log") + " 2>&1";
  EXPECT_NE(std::system(wrong.c_str()), 0);
  EXPECT_NE(dstest::read_bytes(dir / "wrong.log").find("has shape"), std::string::npos)
      << dstest::read_bytes(dir / "wrong.log");
}
