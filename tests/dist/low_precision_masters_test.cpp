// DeepSpeed's low-precision masters at ZeRO stages 1-3 over two ranks:
// bf16.bf16_master_weights_and_grads (with bf16_optimizer_states or the CPU Adam's fp32 moments)
// and fp16.fp16_master_weights_and_grads (fp32 moments, CPU offload). The master is the 16-bit
// partition itself, so:
//  - the first step is bit for bit the fp32-master run's (both apply the same fp32 update to the
//    same 16-bit weights and round it), and later steps part (the fp32 master keeps what the
//    16-bit weights round away): the test sees the masters really are 16-bit;
//  - the optimizer holds 8 (fp32 moments) or 4 (bf16 moments) bytes per partition element
//    instead of 12;
//  - training goes on (the loss falls), checkpoints resume bit for bit and load into fp32-master
//    runs (the files hold fp32, as always);
//  - the update during backward (overlap_step, overlap_forward) and a pipeline's stages step them
//    as the plain step does;
//  - DeepSpeed's rules are enforced, naming the keys.
#include <gtest/gtest.h>

#include <map>
#include <mutex>

#include "deepspeed/deepspeed.h"
#include "deepspeed/errors.h"
#include "deepspeed/pipe.h"
#include "runtime/engine_state.h"
#include "support/checkpoint_run.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/half_mlp.h"
#include "support/pipeline_gpt.h"
#include "support/ranks.h"
#include "support/resume_alike.h"
#include "support/training_run.h"
#include "util/torch_compat.h"

namespace low_precision_masters_test {
namespace {

enum class Masters { kFp32, kBf16WithFp32Moments, kBf16WithBf16Moments };

nlohmann::json bf16_config(int stage, Masters masters) {
  auto c = dstest::base_config(2, 1, stage);
  c["bf16"] = {{"enabled", true}};
  c["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
  if (masters != Masters::kFp32) c["bf16"]["bf16_master_weights_and_grads"] = true;
  if (masters == Masters::kBf16WithBf16Moments) c["bf16"]["bf16_optimizer_states"] = true;
  return c;
}

dstest::RunResult train(int stage, Masters masters, int steps) {
  dstest::RunSpec s;
  s.world_size = 2;
  s.steps = steps;
  s.config = bf16_config(stage, masters);
  return dstest::train_gpt(s);
}

}  // namespace

class Bf16Masters : public ::testing::TestWithParam<int> {};

TEST_P(Bf16Masters, FirstStepAsFp32MastersThenTheirOwnWithLessMemory) {
  const int stage = GetParam();
  const auto fp32 = train(stage, Masters::kFp32, 1);
  for (Masters m : {Masters::kBf16WithFp32Moments, Masters::kBf16WithBf16Moments}) {
    SCOPED_TRACE(m == Masters::kBf16WithBf16Moments ? "bf16 moments" : "fp32 moments");
    const auto one = train(stage, m, 1);
    EXPECT_EQ(one.losses, fp32.losses);
    EXPECT_TRUE(dstest::bit_identical(one.weights, fp32.weights));
    // Per partition element: fp32 masters 4 + moments 8 = 12; bf16 masters are the partition (0)
    // beside moments of 8 (fp32) or 4 (bf16).
    const int64_t want = m == Masters::kBf16WithBf16Moments ? 4 : 8;
    EXPECT_EQ(dstest::optimizer_state_bytes(one) * 12, dstest::optimizer_state_bytes(fp32) * want)
        << dstest::optimizer_state_bytes(one) << " bytes against fp32 masters' "
        << dstest::optimizer_state_bytes(fp32);
  }
  // Over more steps the fp32 masters keep what bf16 rounds away: the runs part, both train.
  const int steps = 12;
  const auto fp32_long = train(stage, Masters::kFp32, steps);
  for (Masters m : {Masters::kBf16WithFp32Moments, Masters::kBf16WithBf16Moments}) {
    const auto low = train(stage, m, steps);
    EXPECT_FALSE(dstest::bit_identical(low.weights, fp32_long.weights));
    EXPECT_LT(low.losses.back(), 0.8 * low.losses.front());
    EXPECT_LT(std::abs(low.losses.back() - fp32_long.losses.back()), 0.05 * fp32_long.losses.back())
        << "bf16 masters " << low.losses.back() << ", fp32 masters " << fp32_long.losses.back();
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, Bf16Masters, ::testing::Values(1, 2, 3));

// Stage 3 with its parameter partition in a file (offload_param "nvme", the masters then a bf16
// host copy beside it, written back to the file after each step): the first step is the fp32
// masters', the optimizer holds 10 bytes an element (2 + 8) where fp32 masters hold 12.
TEST(Bf16MastersParamSwap, AHostCopyBesideTheFile) {
  dstest::TempDir dir;
  auto run = [&](Masters m) {
    dstest::RunSpec s;
    s.world_size = 2;
    s.steps = 1;
    s.config = bf16_config(3, m);
    s.config["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
    s.config["zero_optimization"]["offload_param"] = {{"device", "nvme"},
                                                      {"nvme_path", dir.path()},
                                                      {"buffer_count", 2},
                                                      {"buffer_size", 100000},
                                                      {"max_in_cpu", 0}};
    s.config["aio"] = {{"block_size", 8192}, {"queue_depth", 4}};
    return dstest::train_gpt(s);
  };
  const auto fp32 = run(Masters::kFp32), low = run(Masters::kBf16WithFp32Moments);
  EXPECT_EQ(low.losses, fp32.losses);
  EXPECT_TRUE(dstest::bit_identical(low.weights, fp32.weights));
  EXPECT_EQ(dstest::optimizer_state_bytes(low) * 12, dstest::optimizer_state_bytes(fp32) * 10)
      << dstest::optimizer_state_bytes(low) << " bytes against fp32 masters' "
      << dstest::optimizer_state_bytes(fp32);
}

// The 16-bit masters are what the optimizer holds (no fp32 copy), with moments in the dtype the
// config names.
TEST(Bf16MastersState, TheOptimizerStepsThePartitionItself) {
  for (Masters m : {Masters::kBf16WithFp32Moments, Masters::kBf16WithBf16Moments}) {
    dstest::RunSpec s;
    s.world_size = 1;
    s.steps = 1;
    s.config = bf16_config(2, m);
    s.after_training = [&](deepspeed::Engine& engine) {
      auto& opt = *engine.optimizer();
      ASSERT_EQ(opt.param_groups().size(), 1u);
      const at::Tensor master = opt.param_groups()[0].params()[0];
      EXPECT_EQ(master.scalar_type(), at::kBFloat16);
      auto& st = static_cast<torch::optim::AdamWParamState&>(
          *opt.state().at(deepspeed::compat::optimizer_state_key(master)));
      EXPECT_EQ(st.exp_avg().scalar_type(),
                m == Masters::kBf16WithBf16Moments ? at::kBFloat16 : at::kFloat);
      // The partition of one rank is the whole flat buffer: the module's first weight is in it.
      const at::Tensor first = engine.module().parameters()[0];
      EXPECT_EQ(first.storage().data(), master.storage().data());
    };
    dstest::train_gpt(s);
  }
}

// offload_optimizer.overlap_step over 16-bit masters: each bucket's range of the partition is
// updated during backward, in place; bit for bit the serial step, with accumulation.
TEST(Bf16MastersOverlap, UpdateDuringBackwardTrainsAsTheSerialStep) {
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    dstest::RunSpec s;
    s.world_size = 2;
    s.steps = 4;
    s.config = bf16_config(stage, Masters::kBf16WithBf16Moments);
    s.config["gradient_accumulation_steps"] = 2;
    s.config["zero_optimization"]["offload_optimizer"]["overlap_step"] = false;
    const auto serial = dstest::train_gpt(s);
    s.config["zero_optimization"]["offload_optimizer"]["overlap_step"] = true;
    const auto overlapped = dstest::train_gpt(s);
    EXPECT_EQ(overlapped.losses, serial.losses);
    EXPECT_TRUE(dstest::bit_identical(overlapped.weights, serial.weights));
  }
  // overlap_forward (one rank, stages 1-2): the update's last ranges run into the next forward.
  for (int stage : {1, 2}) {
    SCOPED_TRACE("overlap_forward, stage " + std::to_string(stage));
    dstest::RunSpec s;
    s.steps = 4;
    s.config = bf16_config(stage, Masters::kBf16WithFp32Moments);
    s.config["zero_optimization"]["offload_optimizer"]["overlap_step"] = true;
    const auto waiting = dstest::train_gpt(s);
    s.config["zero_optimization"]["offload_optimizer"]["overlap_forward"] = true;
    bool handed_over = false;
    s.after_training = [&](deepspeed::Engine& engine) {
      handed_over = deepspeed::state_of(engine).stage->step_handed_over();
    };
    const auto forward = dstest::train_gpt(s);
    EXPECT_TRUE(handed_over) << "the last step was not handed over to the next forward";
    EXPECT_EQ(forward.losses, waiting.losses);
    EXPECT_TRUE(dstest::bit_identical(forward.weights, waiting.weights));
  }
}

// In a pipeline (2 stages, one rank each) at ZeRO stages 1 and 2 with bf16 masters: the first
// step is the fp32 masters' (the second batch's loss is theirs), later steps part, the loss falls.
TEST(Bf16MastersPipeline, FirstStepAsFp32MastersThenTrains) {
  for (int zero : {1, 2}) {
    SCOPED_TRACE("ZeRO stage " + std::to_string(zero));
    std::map<bool, std::vector<double>> losses;
    std::mutex mu;
    for (bool low : {false, true}) {
      dstest::run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
        auto args = dstest::pipeline_args(comm, 2, zero, dstest::tiny_pipeline_gpt(false));
        args.config_json["bf16"] = {{"enabled", true}, {"bf16_master_weights_and_grads", low}};
        args.config_json["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
        auto engine = deepspeed::pipe::initialize_pipeline(args);
        auto mine = dstest::train_pipeline_steps(*engine, comm, 0, 6);
        std::lock_guard<std::mutex> lock(mu);
        if (comm->rank() == 0) losses[low] = mine;
      });
    }
    ASSERT_EQ(losses[true].size(), 6u);
    EXPECT_EQ(losses[true][0], losses[false][0]);
    EXPECT_EQ(losses[true][1], losses[false][1]);
    EXPECT_NE(losses[true], losses[false]);
    EXPECT_LT(losses[true].back(), losses[true].front());
  }
}

// Saved with bf16 masters at step 2 and resumed: bit for bit the uninterrupted run. The same
// checkpoint loads into an fp32-master run, which then takes the same first step (the masters'
// values are the bf16 weights, the moments fp32 in both), at two ranks and resharded to one.
TEST(Bf16MastersCheckpoint, ResumesBitForBitAndLoadsIntoFp32Masters) {
  for (int stage : {2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    dstest::TempDir dir;
    dstest::CheckpointJob job;
    job.world_size = 2;
    job.config = bf16_config(stage, Masters::kBf16WithFp32Moments);
    const auto midway = dstest::expect_resumed_midway_bit_for_bit(job, dir.path());
    dstest::CheckpointJob resume = midway.resume;
    const auto& whole = midway.whole;

    resume.config = bf16_config(stage, Masters::kFp32);
    resume.steps = 3;
    const auto into_fp32 = dstest::run_checkpoint_job(resume);
    ASSERT_EQ(into_fp32.losses.size(), 1u);
    EXPECT_EQ(into_fp32.losses[0], whole.losses[2]);
    resume.config = bf16_config(stage, Masters::kBf16WithFp32Moments);
    const auto three = dstest::run_checkpoint_job(resume);
    EXPECT_TRUE(dstest::bit_identical(into_fp32.weights, three.weights));

    // Resharded to one rank: bf16 masters and fp32 masters loaded from the same checkpoint take
    // the same step (the reshard hands both the same fp32 values).
    resume.world_size = 1;
    const auto one_low = dstest::run_checkpoint_job(resume);
    resume.config = bf16_config(stage, Masters::kFp32);
    const auto one_fp32 = dstest::run_checkpoint_job(resume);
    EXPECT_EQ(one_low.start_step, 2);
    EXPECT_EQ(one_low.losses, one_fp32.losses);
    EXPECT_TRUE(dstest::bit_identical(one_low.weights, one_fp32.weights));
  }
}

// fp16.fp16_master_weights_and_grads (DeepSpeed: CPU offload, CPU Adam): on a model with CPU
// kernels for fp16 (computing in fp32 inside), fp16 masters with fp32 moments. Overflowed steps
// are skipped as with fp32 masters; the first applied step equals theirs; the loss falls.
TEST(Fp16Masters, FirstAppliedStepAsFp32MastersAndTheLossFalls) {
  std::map<bool, std::vector<double>> losses;
  std::map<bool, std::vector<torch::Tensor>> first_weights;
  std::mutex mu;
  for (bool fp16_masters : {false, true}) {
    dstest::run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
      // One rank at a time: the generator is global, and rank 0's weights (broadcast) must be
      // the same in both runs.
      dstest::HalfMlp model{nullptr};
      {
        std::lock_guard<std::mutex> lock(mu);
        torch::manual_seed(5);
        model = dstest::HalfMlp();
      }
      auto config = dstest::base_config(8, 1, 2);
      config["optimizer"]["params"]["lr"] = 1e-2;
      config["fp16"] = {{"enabled", true},
                        {"initial_scale_power", 8},
                        {"fp16_master_weights_and_grads", fp16_masters}};
      config["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
      auto [engine, opt, loader, sched] = deepspeed::initialize<dstest::HalfMlpImpl>(
          {.model = model.ptr(), .config_json = config, .comm = comm});
      const at::Tensor master = opt->param_groups()[0].params()[0];
      EXPECT_EQ(master.scalar_type(), fp16_masters ? at::kHalf : at::kFloat);
      std::vector<double> mine;
      std::vector<torch::Tensor> first;
      for (int64_t step = 0; step < 80; ++step) {
        auto b = dstest::half_mlp_batch(comm->rank(), step);
        engine->backward(engine->forward(b.x, b.y));
        engine->step();
        if (!engine->was_step_applied()) continue;
        mine.push_back(engine->last_loss());
        if (mine.size() == 1)
          for (auto& p : model->parameters()) first.push_back(p.detach().clone());
      }
      std::lock_guard<std::mutex> lock(mu);
      if (comm->rank() == 0) {
        losses[fp16_masters] = mine;
        first_weights[fp16_masters] = first;
      }
    });
  }
  ASSERT_GT(losses[true].size(), 40u);
  EXPECT_EQ(losses[true].front(), losses[false].front());
  EXPECT_TRUE(dstest::bit_identical(first_weights[true], first_weights[false]));
  EXPECT_LT(losses[true].back(), 0.5 * losses[true].front());
  EXPECT_LT(losses[true].back(), 1.2 * losses[false].back());
}

// DeepSpeed's rules, each refused naming the keys (on every rank, at initialize()).
TEST(LowPrecisionMastersErrors, EachRuleNamesItsKeys) {
  auto refusal = [](nlohmann::json config) {
    dstest::RunSpec s;
    s.world_size = 1;
    s.steps = 1;
    s.config = std::move(config);
    return dstest::message_of<deepspeed::ConfigError>([&] { dstest::train_gpt(s); });
  };
  auto c = bf16_config(0, Masters::kBf16WithBf16Moments);
  EXPECT_CONTAINS(refusal(c), "needs ZeRO stage 1, 2 or 3");

  c = bf16_config(2, Masters::kBf16WithFp32Moments);
  c["zero_optimization"]["offload_optimizer"]["device"] = "none";
  EXPECT_CONTAINS(refusal(c),
                  "bf16.bf16_master_weights_and_grads' needs "
                  "zero_optimization.offload_optimizer.device \"cpu\" (or \"nvme\") unless");

  c = bf16_config(2, Masters::kBf16WithBf16Moments);
  c["data_types"] = {{"grad_accum_dtype", "fp32"}};
  EXPECT_CONTAINS(refusal(c), "data_types.grad_accum_dtype is \"fp32\"");

  c = bf16_config(2, Masters::kBf16WithBf16Moments);
  c["optimizer"] = {{"type", "Lion"}, {"params", {{"lr", 1e-4}}}};
  EXPECT_CONTAINS(refusal(c), "needs the config's optimizer \"Adam\" or \"AdamW\"");

  c = bf16_config(2, Masters::kFp32);
  c["bf16"]["bf16_optimizer_states"] = true;
  EXPECT_CONTAINS(refusal(c),
                  "'bf16.bf16_optimizer_states' is true but "
                  "'bf16.bf16_master_weights_and_grads' is not");

  c = dstest::base_config(2, 1, 2);
  c["fp16"] = {{"enabled", true}, {"fp16_master_weights_and_grads", true}};
  EXPECT_CONTAINS(refusal(c),
                  "'fp16.fp16_master_weights_and_grads' needs "
                  "zero_optimization.offload_optimizer.device \"cpu\" (or \"nvme\")");

  // With its block disabled the key is ignored (a warning), as DeepSpeed reads it only there.
  c = dstest::base_config(2, 1, 2);
  c["bf16"] = {{"enabled", false}, {"bf16_master_weights_and_grads", true}};
  dstest::RunSpec s;
  s.steps = 1;
  s.config = c;
  EXPECT_NO_THROW(dstest::train_gpt(s));
}

}  // namespace low_precision_masters_test
