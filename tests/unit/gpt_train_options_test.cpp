// gpt_train's command line (examples/gpt/train_options.h) without starting a process: flags that
// would do nothing, crash later or fail without naming themselves are refused by name
// (--n_embd/--n_head, --steps, --pipeline_stages, --tensor_parallel, --vocab_size with text);
// --save_dir alone saves after the last step; a resumed pipeline's data position counts the
// restored samples; --activation_checkpointing reaches the pipeline models; and a text shorter
// than one window names the file and --block_size.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "deepspeed/comm.h"
#include "deepspeed/errors.h"
#include "gpt/pipeline_model.h"
#include "gpt/text_dataset.h"
#include "gpt/tp_pipeline_model.h"
#include "gpt/train_options.h"
#include "support/expect.h"
#include "support/files.h"

namespace gpt_train_options_test {

namespace {

gpt_train::Options parse(std::vector<std::string> flags) {
  flags.insert(flags.begin(), "gpt_train");
  return gpt_train::parse_options(flags);
}

std::string refusal(const std::vector<std::string>& flags) {
  return dstest::message_of<deepspeed::ConfigError>([&] { parse(flags); });
}

}  // namespace

// The attention splits n_embd into n_head heads: a remainder used to stop the run in the model's
// constructor with a C++ stack trace naming neither flag; n_head 0 divided by zero.
TEST(GptTrainOptions, HeadsThatDoNotDivideTheWidthAreRefusedNamingBothFlags) {
  const std::string m = refusal({"--n_embd", "30", "--n_head", "4"});
  EXPECT_CONTAINS(m, "--n_embd 30");
  EXPECT_CONTAINS(m, "--n_head 4");
  EXPECT_CONTAINS(refusal({"--n_head", "0"}), "--n_head 0");
  EXPECT_NO_THROW(parse({"--n_embd", "32", "--n_head", "4"}));
}

TEST(GptTrainOptions, NonPositiveStepsAreRefused) {
  EXPECT_CONTAINS(refusal({"--steps", "0"}), "--steps 0");
  EXPECT_CONTAINS(refusal({"--steps", "-3"}), "--steps -3");
  EXPECT_EQ(parse({"--steps", "1"}).steps, 1);
}

// 0 (off) and -1 (the config's pipeline.stages) are the documented values below 1; -2 used to be
// read as -1.
TEST(GptTrainOptions, PipelineStagesBelowMinusOneAreRefused) {
  const std::string m = refusal({"--pipeline_stages", "-2"});
  EXPECT_CONTAINS(m, "--pipeline_stages -2");
  EXPECT_CONTAINS(m, "-1");
  EXPECT_EQ(parse({"--pipeline_stages", "-1"}).pipeline_stages, -1);
  EXPECT_EQ(parse({"--pipeline_stages", "0"}).pipeline_stages, 0);
}

TEST(GptTrainOptions, TensorParallelBelowOneIsRefused) {
  EXPECT_CONTAINS(refusal({"--tensor_parallel", "0"}), "--tensor_parallel 0");
  EXPECT_CONTAINS(refusal({"--tensor_parallel", "-1"}), "--tensor_parallel -1");
  EXPECT_EQ(parse({"--tensor_parallel", "2"}).tensor_parallel, 2);
}

// A negative stride was silently the default; 0 is the documented default (block_size / 2).
TEST(GptTrainOptions, ANegativeStrideIsRefused) {
  EXPECT_CONTAINS(refusal({"--stride", "-4"}), "--stride -4");
  EXPECT_EQ(parse({"--stride", "0", "--block_size", "32"}).stride, 16);
  EXPECT_EQ(parse({"--stride", "5"}).stride, 5);
}

// Text is bytes: a token of 255 indexes past a smaller embedding (an out-of-range error deep in
// the forward). --random_tokens draws from the vocabulary given, so any size > 0 goes there.
TEST(GptTrainOptions, AVocabularyBelow256WithTextIsRefused) {
  const std::string m = refusal({"--vocab_size", "100"});
  EXPECT_CONTAINS(m, "--vocab_size 100");
  EXPECT_CONTAINS(m, "--random_tokens");
  EXPECT_EQ(parse({"--vocab_size", "100", "--random_tokens"}).model.vocab_size, 100);
  EXPECT_EQ(parse({"--vocab_size", "300"}).model.vocab_size, 300);
  EXPECT_CONTAINS(refusal({"--vocab_size", "0", "--random_tokens"}), "--vocab_size 0");
}

// --save_dir without --save_interval used to save nothing: it saves once, after the last step
// (as DeepSpeed's and Hugging Face's example scripts save the final model). With an interval the
// saves stay periodic only.
TEST(GptTrainOptions, SaveDirAloneSavesAfterTheLastStep) {
  auto o = parse({"--save_dir", "ck", "--steps", "5"});
  for (int64_t step = 1; step <= 4; ++step) EXPECT_FALSE(gpt_train::saves_after(o, step)) << step;
  EXPECT_TRUE(gpt_train::saves_after(o, 5));
  o = parse({"--save_dir", "ck", "--save_interval", "2", "--steps", "5"});
  EXPECT_TRUE(gpt_train::saves_after(o, 2));
  EXPECT_TRUE(gpt_train::saves_after(o, 4));
  EXPECT_FALSE(gpt_train::saves_after(o, 5));
  o = parse({"--steps", "5"});
  EXPECT_FALSE(gpt_train::saves_after(o, 5));
  EXPECT_CONTAINS(refusal({"--save_interval", "2"}), "--save_interval needs --save_dir");
  EXPECT_CONTAINS(refusal({"--save_dir", "ck", "--save_interval", "-1"}), "--save_interval -1");
}

// A resumed pipeline job places its loader by the samples the checkpoint says were trained
// (global_samples), in its own micro-batches per data-parallel rank: a job saved after 16 samples
// resumes at micro-batch 4 of each of 2 ranks at micro batch 2, whatever its accumulation. The
// old count, global steps x the NEW job's accumulation, gave 8 (32 samples) at accumulation 8.
TEST(GptTrainOptions, ResumedPipelinePositionCountsTheRestoredSamples) {
  EXPECT_EQ(gpt_train::resumed_micro_batches(16, 2, 2), 4);
  EXPECT_EQ(gpt_train::resumed_micro_batches(16, 2, 1), 8);
  EXPECT_EQ(gpt_train::resumed_micro_batches(0, 2, 2), 0);
  // Not a whole number of this job's micro-batches (another layout): rounded down, so a few
  // samples are trained again rather than skipped.
  EXPECT_EQ(gpt_train::resumed_micro_batches(12, 2, 4), 1);
}

// --activation_checkpointing reaches the pipeline: every layer is a checkpointed segment (the
// interval used to stay -1, the config's pipeline.activation_checkpoint_interval, default 0).
// Without the flag the config's interval still applies (-1).
TEST(GptTrainOptions, ActivationCheckpointingSetsThePipelineInterval) {
  gpt::GPTConfig c{256, 16, 2, 2, 32};
  EXPECT_EQ(gpt::gpt_pipeline(c).activation_checkpoint_interval, -1);
  auto group = deepspeed::comm::make_single_process_communicator();
  EXPECT_EQ(gpt::gpt_tp_pipeline(c, group).activation_checkpoint_interval, -1);
  c.activation_checkpointing = true;
  EXPECT_EQ(gpt::gpt_pipeline(c).activation_checkpoint_interval, 1);
  EXPECT_EQ(gpt::gpt_tp_pipeline(c, group).activation_checkpoint_interval, 1);
}

// A text shorter than one window (block_size + 1 bytes) names the file and the flag to change.
TEST(GptTrainOptions, ATextShorterThanOneWindowNamesTheFileAndBlockSize) {
  dstest::TempDir dir("gpt_short_text");
  const std::string path = dir / "short.txt";
  dstest::write_bytes(path, "0123456789");
  const std::string m = dstest::message_of<deepspeed::ConfigError>(
      [&] { gpt::TextDataset(path, 16, 8); });
  EXPECT_CONTAINS(m, "'" + path + "'");
  EXPECT_CONTAINS(m, "10 bytes");
  EXPECT_CONTAINS(m, "--block_size 16");
  auto o = parse({"--data", path, "--block_size", "16"});
  EXPECT_CONTAINS(dstest::message_of<deepspeed::ConfigError>([&] { gpt_train::make_dataset(o); }),
                  "'" + path + "'");
}

}  // namespace gpt_train_options_test
