// Generation with the example GPT (examples/gpt/generate.*): the kv-cache gives the tokens a full
// recomputation gives; a left-padded batch of prompts of different lengths gives what each prompt
// gives alone; sampling is reproducible by seed and top_k = 1 / top_p 0 reduce to greedy; bad
// sampling options are refused by name; and gpt_generate continues a prompt from a checkpoint
// gpt_train wrote, its model flags defaulting to those gpt_train saved beside it (model_flags.h).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "checkpoint/safetensors.h"
#include "deepspeed/errors.h"
#include "gpt/generate.h"
#include "gpt/model_flags.h"
#include "support/commands.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/ranks.h"

namespace gpt_generate_test {

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
  // The most likely token is always kept (HF's min_tokens_to_keep): top_p 0 is greedy, where it
  // used to drop every token and fail in multinomial.
  for (double p : {0.0, 1e-9}) {
    gpt::SamplingOptions p0;
    p0.greedy = false;
    p0.top_p = p;
    EXPECT_EQ(gpt::generate(*m, kPrompts, 16, p0), want) << "top_p " << p;
  }
}

// As Hugging Face's generate: top_k < 0, top_p outside [0, 1] and temperature <= 0 are refused
// naming the option, where they were taken (a negative top_k as "all", a temperature clamped to
// 1e-6, top_p 1.5 as 1).
TEST(GptGenerate, BadSamplingOptionsAreRefusedByName) {
  auto m = small_model();
  struct Case {
    void (*set)(gpt::SamplingOptions&);
    const char* message;
  };
  const Case cases[] = {
      {[](gpt::SamplingOptions& o) { o.top_k = -1; }, "top_k -1 is negative"},
      {[](gpt::SamplingOptions& o) { o.top_p = 1.5; }, "top_p 1.5 is outside [0, 1]"},
      {[](gpt::SamplingOptions& o) { o.top_p = -0.1; }, "top_p -0.1 is outside [0, 1]"},
      {[](gpt::SamplingOptions& o) { o.top_p = std::nan(""); }, "top_p nan is outside [0, 1]"},
      {[](gpt::SamplingOptions& o) { o.temperature = 0; }, "temperature 0 is not a strictly"},
      {[](gpt::SamplingOptions& o) { o.temperature = -1; }, "temperature -1 is not a strictly"},
  };
  for (const auto& c : cases) {
    gpt::SamplingOptions o;
    o.greedy = false;
    c.set(o);
    EXPECT_CONTAINS(dstest::message_of<deepspeed::ConfigError>(
                        [&] { gpt::generate(*m, kPrompts, 2, o); }),
                    c.message);
    EXPECT_CONTAINS(dstest::message_of<deepspeed::ConfigError>(
                        [&] { gpt::check_sampling(o, "--"); }),
                    std::string("--") + c.message);
  }
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

// Inference never splits the vocabulary (AutoTP cuts the head by its input columns and keeps the
// embedding whole), so gpt_generate --tensor_parallel 2 runs a vocabulary of 1001 and prints what
// one process prints. It used to refuse it as training must (VocabParallelEmbedding).
TEST(GptGenerate, TensorParallelDoesNotNeedTheVocabularyDivided) {
  dstest::TempDir dir("gpt_generate_vocab");
  const std::string file = dir / "model.safetensors";
  {
    torch::manual_seed(3);
    gpt::GPTImpl model(gpt::GPTConfig{1001, 32, 2, 2, 32});
    deepspeed::checkpoint::NamedTensors tensors;
    for (auto& p : model.named_parameters()) tensors.emplace_back(p.key(), p.value().detach());
    for (auto& b : model.named_buffers()) tensors.emplace_back(b.key(), b.value());
    deepspeed::checkpoint::write_safetensors(file, tensors);
  }
  const std::string args = " --load_dir " + file +
                           " --vocab_size 1001 --n_layer 2 --n_head 2 --n_embd 32 --block_size 32"
                           " --prompt 'The ' --max_new_tokens 8 --greedy";
  // The last line, without dsrun's "[rank 0] " prefix.
  auto last_line = [](std::string out) {
    while (!out.empty() && out.back() == '\n') out.pop_back();
    const auto nl = out.rfind('\n');
    std::string line = nl == std::string::npos ? out : out.substr(nl + 1);
    const std::string prefix = "[rank 0] ";
    return line.rfind(prefix, 0) == 0 ? line.substr(prefix.size()) : line;
  };
  const std::string one = dir / "one.log", two = dir / "two.log";
  const std::string alone = dstest::bin_dir() + "/gpt_generate" + args + " > " + one + " 2>&1";
  ASSERT_EQ(std::system(alone.c_str()), 0) << dstest::read_bytes(one);
  const std::string split =
      dstest::dsrun_command(2, "gpt_generate --tensor_parallel 2" + args, two);
  ASSERT_EQ(std::system(split.c_str()), 0) << dstest::read_bytes(two);
  const std::string want = last_line(dstest::read_bytes(one));
  EXPECT_EQ(want.rfind("The ", 0), 0u) << want;
  EXPECT_EQ(last_line(dstest::read_bytes(two)), want);
}

// gpt_train (2 ranks, ZeRO-2) saves once for the tests below, which run gpt_generate on it.
class GptGenerateCli : public ::testing::Test {
 protected:
  static constexpr const char* kModel = " --n_layer 2 --n_head 2 --n_embd 32 --block_size 32";

  static void SetUpTestSuite() {
    dir_ = new dstest::TempDir("gpt_generate");
    std::ofstream(*dir_ / "ds_config.json")
        << R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
               "steps_per_print": 0, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
               "zero_optimization": {"stage": 2}})";
    const std::string train = dstest::dsrun_command(
        2, "gpt_train --deepspeed_config " + (*dir_ / "ds_config.json") + kModel +
               " --steps 40 --save_dir " + ck() + " --save_interval 40",
        *dir_ / "train.log");
    trained_ = std::system(train.c_str()) == 0;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(trained_) << dstest::read_bytes(*dir_ / "train.log"); }

  static std::string ck() { return *dir_ / "ck"; }

  struct Run {
    int status;
    std::string output;
    std::string last_line() const {
      std::string out = output;
      while (!out.empty() && out.back() == '\n') out.pop_back();
      const auto nl = out.rfind('\n');
      return nl == std::string::npos ? out : out.substr(nl + 1);
    }
  };
  // gpt_generate with `args`: its exit status, stdout and stderr.
  static Run generate(const std::string& args) {
    const std::string log = *dir_ / "gen.log";
    const std::string cmd = dstest::bin_dir() + "/gpt_generate " + args + " > " + log + " 2>&1";
    const int status = std::system(cmd.c_str());
    return {status, dstest::read_bytes(log)};
  }

  static dstest::TempDir* dir_;
  static bool trained_;
};
dstest::TempDir* GptGenerateCli::dir_ = nullptr;
bool GptGenerateCli::trained_ = false;

// gpt_generate continues a prompt from that checkpoint and prints it as its last line.
TEST_F(GptGenerateCli, ContinuesAPromptFromAGptTrainCheckpoint) {
  const auto run =
      generate("--load_dir " + ck() + kModel + " --prompt 'The ' --max_new_tokens 20 --greedy");
  ASSERT_EQ(run.status, 0) << run.output;
  const std::string last = run.last_line();
  ASSERT_EQ(last.rfind("The ", 0), 0u) << run.output;
  EXPECT_EQ(last.size(), 4u + 20u) << run.output;
  // 40 steps on English text: the continuation is text (printable ASCII), not arbitrary bytes.
  for (unsigned char c : last.substr(4)) EXPECT_TRUE(c >= 32 && c < 127) << int(c) << " in " << last;
}

// gpt_train wrote its model flags beside the checkpoint: without any model flag gpt_generate
// builds that model (the defaults, --n_layer 4 --n_embd 256 ..., used to be refused) and gives
// what the flags as given to gpt_train give.
TEST_F(GptGenerateCli, ModelFlagsDefaultFromTheSavedFile) {
  const std::string saved = dstest::read_bytes(ck() + "/global_step40/gpt_model.json");
  EXPECT_CONTAINS(saved, "\"n_head\": 2");
  EXPECT_CONTAINS(saved, "\"n_layer\": 2");
  const std::string common = "--load_dir " + ck() + " --prompt 'The ' --max_new_tokens 12 --greedy";
  const auto with_flags = generate(common + kModel);
  ASSERT_EQ(with_flags.status, 0) << with_flags.output;
  const auto without = generate(common);
  ASSERT_EQ(without.status, 0) << without.output;
  EXPECT_EQ(without.last_line(), with_flags.last_line());
}

// A model flag that differs from the saved one is refused naming the flag and both values. A
// smaller --n_layer (block1.* left unread) and --n_head 4 (no tensor changes) used to load and
// generate garbage; --n_embd 64 was refused naming a tensor.
TEST_F(GptGenerateCli, AConflictingModelFlagIsRefusedNamingIt) {
  const std::string common =
      "--load_dir " + ck() + " --prompt x --max_new_tokens 4 --block_size 32";
  struct Case {
    const char* flags;
    const char* message;
  };
  // Each case is the training's model but for one flag.
  for (const Case& c :
       {Case{" --n_layer 1 --n_head 2 --n_embd 32", "--n_layer 1 conflicts with \"n_layer\": 2"},
        Case{" --n_layer 2 --n_head 4 --n_embd 32", "--n_head 4 conflicts with \"n_head\": 2"},
        Case{" --n_layer 2 --n_head 2 --n_embd 64", "--n_embd 64 conflicts with \"n_embd\": 32"},
        Case{" --n_layer 2 --n_head 2 --n_embd 32 --no_bias",
             "--no_bias (bias false) conflicts with \"bias\": true"},
        Case{" --n_layer 2 --n_head 2 --n_embd 32 --tie_embeddings",
             "--tie_embeddings (tie_embeddings true) conflicts"},
        Case{" --n_layer 2 --n_head 2 --n_embd 32 --gelu_tanh",
             "--gelu_tanh (gelu_tanh true) conflicts"}}) {
    const auto run = generate(common + c.flags);
    EXPECT_NE(run.status, 0) << c.flags << ": " << run.output;
    EXPECT_CONTAINS(run.output, c.message);
    EXPECT_CONTAINS(run.output, "global_step40/gpt_model.json");
  }
}

// A checkpoint without gpt_model.json (an older gpt_train's; here a copy with the file removed)
// takes the flags given, and refuses tensors the model would leave unread, naming the first.
TEST_F(GptGenerateCli, WithoutTheSavedFileLeftoverTensorsAreRefused) {
  namespace fs = std::filesystem;
  const std::string old = *dir_ / "old";
  fs::remove_all(old);
  fs::copy(ck(), old, fs::copy_options::recursive);
  ASSERT_TRUE(fs::remove(old + "/global_step40/gpt_model.json"));
  const std::string common = "--load_dir " + old + " --prompt x --max_new_tokens 4 --greedy";
  const auto ok = generate(common + kModel);
  EXPECT_EQ(ok.status, 0) << ok.output;
  const std::string width = " --n_head 2 --n_embd 32 --block_size 32";
  struct Case {
    std::string flags;
    const char* tensor;
  };
  for (const Case& c :
       {Case{" --n_layer 1" + width, "has tensor \"block1."},
        Case{" --n_layer 2 --tie_embeddings" + width, "has tensor \"head.weight\""},
        Case{" --n_layer 2 --no_bias" + width, "has tensor \"block0.attn.qkv.bias\""}}) {
    const auto run = generate(common + c.flags);
    EXPECT_NE(run.status, 0) << c.flags << ": " << run.output;
    EXPECT_CONTAINS(run.output, c.tensor);
    EXPECT_CONTAINS(run.output, "that this model does not have");
  }
  // gpt::load_weights refuses them the same way.
  gpt::GPTConfig one_layer{256, 32, 1, 2, 32};
  gpt::GPTImpl model(one_layer);
  EXPECT_CONTAINS(dstest::message_of<deepspeed::CheckpointError>(
                      [&] { gpt::load_weights(model, old); }),
                  "has tensor \"block1.");
}

// ds_to_fp32's default output, pytorch_model.bin (a torch.save file), generates what the
// checkpoint does (both are its fp32 masters), as does its folder, and its tensor names (read
// from the pickle) still refuse a model that would leave some unread, from the file or folder.
TEST_F(GptGenerateCli, ReadsDsToFp32sPytorchModelBin) {
  const std::string out = *dir_ / "export";
  const std::string log = *dir_ / "export.log";
  ASSERT_EQ(std::system((dstest::bin_dir() + "/ds_to_fp32 " + ck() + " " + out + " > " + log +
                         " 2>&1")
                            .c_str()),
            0)
      << dstest::read_bytes(log);
  const std::string tail = " --prompt 'The ' --max_new_tokens 8 --greedy";
  const auto from_checkpoint = generate("--load_dir " + ck() + kModel + tail);
  ASSERT_EQ(from_checkpoint.status, 0) << from_checkpoint.output;
  const std::string bin = out + "/pytorch_model.bin";
  const auto from_bin = generate("--load_dir " + bin + kModel + tail);
  ASSERT_EQ(from_bin.status, 0) << from_bin.output;
  EXPECT_EQ(from_bin.last_line(), from_checkpoint.last_line());
  // The export folder itself: the same tokens, and the same refusal, read through its file.
  const auto from_folder = generate("--load_dir " + out + kModel + tail);
  ASSERT_EQ(from_folder.status, 0) << from_folder.output;
  EXPECT_EQ(from_folder.last_line(), from_checkpoint.last_line());
  for (const std::string& load : {bin, out}) {
    const auto one_layer = generate("--load_dir " + load +
                                    " --n_layer 1 --n_head 2 --n_embd 32 --block_size 32" + tail);
    EXPECT_NE(one_layer.status, 0) << one_layer.output;
    EXPECT_CONTAINS(one_layer.output, "has tensor \"block1.");
  }
}

// top_p 0 keeps only the most likely token: the greedy continuation (it used to fail in
// multinomial). Sampling flags HF refuses are refused naming the flag, before anything loads.
TEST_F(GptGenerateCli, TopP0IsGreedyAndBadSamplingFlagsAreRefused) {
  const std::string common =
      "--load_dir " + ck() + kModel + " --prompt 'The ' --max_new_tokens 12";
  const auto greedy = generate(common + " --greedy");
  ASSERT_EQ(greedy.status, 0) << greedy.output;
  const auto p0 = generate(common + " --top_p 0 --seed 5");
  ASSERT_EQ(p0.status, 0) << p0.output;
  EXPECT_EQ(p0.last_line(), greedy.last_line());
  for (const char* flag : {"--temperature 0", "--top_p 1.5", "--top_k -1"}) {
    const auto run = generate(common + " " + flag);
    EXPECT_NE(run.status, 0) << flag << ": " << run.output;
    EXPECT_CONTAINS(run.output, std::string("gpt_generate: error: ") + flag);
  }
}

// A prompt and --max_new_tokens beyond the block size are refused naming both flags and the
// block size, before the checkpoint loads and without C++ stack frames (generate()'s TORCH_CHECK
// used to stop it with its backtrace); a negative --max_new_tokens is refused by name.
TEST_F(GptGenerateCli, TooManyNewTokensAreRefusedNamingTheFlags) {
  const std::string common = "--load_dir " + ck() + kModel + " --greedy --prompt 'The '";
  auto run = generate(common + " --max_new_tokens 40");
  EXPECT_NE(run.status, 0) << run.output;
  EXPECT_CONTAINS(run.output, "gpt_generate: error: --prompt of 4 tokens + --max_new_tokens 40");
  EXPECT_CONTAINS(run.output, "block_size 32");
  EXPECT_EQ(run.output.find("Exception raised from"), std::string::npos) << run.output;
  run = generate(common + " --max_new_tokens -1");
  EXPECT_NE(run.status, 0) << run.output;
  EXPECT_CONTAINS(run.output, "gpt_generate: error: --max_new_tokens -1");
  run = generate(common + " --max_new_tokens 28");  // 4 + 28 = 32 fits
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_EQ(run.last_line().size(), 4u + 28u) << run.output;
}

// A torch error that reaches main (here the model's own check: --n_embd 30 is not split into 4
// heads, for a folder without saved model flags) prints its message without the C++ stack frames
// c10::Error::what() carries in libtorch 1.13.
TEST(GptGenerate, TorchErrorsPrintWithoutStackFrames) {
  dstest::TempDir dir("gpt_generate_torch_error");
  const std::string log = dir / "log.txt";
  const std::string cmd = dstest::bin_dir() + "/gpt_generate --load_dir " + (dir / "none") +
                          " --prompt x --max_new_tokens 2 --n_embd 30 --n_head 4 > " + log +
                          " 2>&1";
  EXPECT_NE(std::system(cmd.c_str()), 0);
  const std::string output = dstest::read_bytes(log);
  EXPECT_CONTAINS(output, "gpt_generate: error: n_embd (30) must be divisible by n_head (4)");
  EXPECT_EQ(output.find("Exception raised from"), std::string::npos) << output;
  EXPECT_EQ(output.find("frame #"), std::string::npos) << output;
}

// save_model_flags writes into the tag folder `latest` names and read_model_flags gives the model
// back; a file with an unknown, missing or mistyped key is refused naming the file and the key.
TEST(GptModelFlags, RoundTripAndMalformedFilesAreNamed) {
  dstest::TempDir dir("gpt_model_flags");
  std::filesystem::create_directory(dir / "t1");
  dstest::write_bytes(dir / "latest", "t1\n");
  gpt::GPTConfig c;
  c.n_layer = 3;
  c.n_head = 8;
  c.vocab_size = 1000;
  c.bias = false;
  c.gelu_tanh = true;
  gpt::save_model_flags(dir.path(), c);
  EXPECT_EQ(gpt::checkpoint_tag_dir(dir.path(), ""), dir / "t1");
  const auto back = gpt::read_model_flags(dir / "t1");
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(gpt::model_flags_json(*back), gpt::model_flags_json(c));
  EXPECT_FALSE(gpt::read_model_flags(dir.path()).has_value());  // no file: an older gpt_train

  const std::string file = dir / "t1/gpt_model.json";
  auto with = [&](const char* key, const nlohmann::json& value) {
    auto j = gpt::model_flags_json(c);
    if (value.is_null())
      j.erase(key);
    else
      j[key] = value;
    dstest::write_bytes(file, j.dump());
    return dstest::message_of<deepspeed::ConfigError>(
        [&] { gpt::read_model_flags(dir / "t1"); });
  };
  EXPECT_CONTAINS(with("n_kv_head", 2), "\"n_kv_head\" is not a model field");
  EXPECT_CONTAINS(with("n_head", nullptr), "\"n_head\" is missing");
  EXPECT_CONTAINS(with("n_embd", 2.5), "\"n_embd\" is not a non-negative integer");
  EXPECT_CONTAINS(with("bias", 1), "\"bias\" is not true or false");
  EXPECT_CONTAINS(with("bias", 1), file);

  // A flag given with the saved value is accepted; the other fields come from the file.
  gpt::GPTConfig parsed;
  parsed.n_head = 8;
  parsed.dropout = 0.25;
  const auto resolved = gpt::resolve_model_flags(parsed, {"--n_head"}, c, file);
  EXPECT_EQ(gpt::model_flags_json(resolved), gpt::model_flags_json(c));
  EXPECT_EQ(resolved.dropout, 0.25);
}

}  // namespace gpt_generate_test
