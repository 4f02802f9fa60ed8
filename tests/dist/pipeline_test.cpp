// Pipeline parallelism against data parallelism: the example GPT as a PipelineModule on
// pipe 2 x data 2, pipe 4 x data 1 and pipe 1 x data 4 (4 ranks as threads) gives the per-step
// losses of the same layers trained as one module with ZeRO stage 0 at world 4, with the same
// global batch. fp32; the tolerance is kLossTol = 1e-5 relative (only summation orders differ:
// the data-parallel mean is taken over 2 or 4 ranks and the accumulation over 2, 4 or 8
// micro-batches, and the clipping norm is summed per stage). The losses do not depend on where
// the model is cut, so the split itself is checked apart (PipelineEnginePartition).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <stdexcept>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "deepspeed/checkpointing.h"
#include "deepspeed/engine.h"
#include "deepspeed/errors.h"
#include "deepspeed/pipe.h"
#include "gpt/pipeline_model.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/pipeline_gpt.h"
#include "support/ranks.h"
#include "support/training_run.h"

namespace pipeline_test {

namespace dp = deepspeed::pipe;

namespace {

constexpr int kWorld = dstest::kPipeWorld;
constexpr int kGlobalMicro = dstest::kPipeGlobalMicro;
constexpr int kSteps = 3;
using dstest::pipeline_micro_batch;

gpt::GPTConfig tiny_gpt(bool tied) { return dstest::tiny_pipeline_gpt(tied); }
nlohmann::json config(int dp_size, int zero_stage, double clipping = 0.0) {
  return dstest::pipeline_config(dp_size, zero_stage, clipping);
}

// The reference: the same layers as one module, ZeRO stage 0 at world 4.
// `patch` is merged into the config (e.g. a scheduler block).
std::vector<double> reference_losses(bool tied, double clipping,
                                     const nlohmann::json& patch = nlohmann::json::object()) {
  nlohmann::json c = config(kWorld, 0, clipping);
  c.merge_patch(patch);
  return dstest::one_module_losses(kWorld, tiny_gpt(tied), c, "cpu", kSteps);
}

struct PipeRun {
  std::vector<std::vector<double>> losses;  // per rank, per step
  std::vector<int> max_held;                // per rank
  std::vector<int> stage;
  std::vector<double> grad_norm;            // per rank, last step
  std::vector<deepspeed::MemoryReport> memory;  // per rank, after the last step
};

PipeRun pipeline_run(int stages, nlohmann::json cfg, bool tied, int steps = kSteps) {
  PipeRun r;
  r.losses.resize(kWorld);
  r.max_held.resize(kWorld);
  r.stage.resize(kWorld);
  r.grad_norm.resize(kWorld);
  r.memory.resize(kWorld);
  const int dp_size = kWorld / stages;
  run_ranks(kWorld, [&](deepspeed::comm::CommunicatorPtr comm) {
    dp::PipelineInitializeArgs args;
    args.model = gpt::gpt_pipeline(tiny_gpt(tied));
    args.model.num_stages = stages;
    args.config_json = cfg;
    args.comm = comm;
    args.device = "cpu";
    auto engine = dp::initialize_pipeline(args);
    const int data_rank = comm->rank() % dp_size;  // data innermost (comm::Grid)
    for (int k = 0; k < steps; ++k) {
      int m = 0;
      auto data = [&] { return pipeline_micro_batch(k, (m++) * dp_size + data_rank); };
      r.losses[comm->rank()].push_back(engine->train_batch(data));
    }
    r.max_held[comm->rank()] = engine->max_activations_held();
    r.stage[comm->rank()] = engine->stage_id();
    r.grad_norm[comm->rank()] = engine->get_global_grad_norm();
    r.memory[comm->rank()] = engine->memory_report();
  });
  return r;
}

void expect_matches(const PipeRun& run, const std::vector<double>& ref, int stages) {
  ASSERT_EQ(ref.size(), static_cast<size_t>(kSteps));
  std::printf("pipe %d x data %d: max relative loss difference to the reference %.3g\n", stages,
              kWorld / stages, dstest::max_rel_diff(run.losses[0], ref));
  for (int rank = 0; rank < kWorld; ++rank) {
    ASSERT_EQ(run.losses[rank].size(), ref.size());
    // Every rank reports the batch loss, and it is the data-parallel reference's.
    EXPECT_LT(dstest::max_rel_diff(run.losses[rank], ref), dstest::kLossTol)
        << "rank " << rank << " step-0 loss " << run.losses[rank][0] << " vs " << ref[0];
    // 1F1B holds at most (stages - stage) activations, never more than the stage count.
    EXPECT_LE(run.max_held[rank], stages - run.stage[rank]) << "rank " << rank;
    EXPECT_LE(run.max_held[rank], stages);
    EXPECT_GE(run.max_held[rank], 1);
    EXPECT_DOUBLE_EQ(run.grad_norm[rank], run.grad_norm[0]) << "the clipping norm is global";
  }
}

const std::vector<double>& plain_reference() {
  static const std::vector<double> ref = reference_losses(false, 0.0);
  return ref;
}

}  // namespace

TEST(Pipeline, TwoStagesTwoDataRanksMatchDataParallel) {
  auto run = pipeline_run(2, config(2, 0), false);
  expect_matches(run, plain_reference(), 2);
  // Losses fall: it trains.
  EXPECT_LT(run.losses[0].back(), run.losses[0].front());
}

TEST(Pipeline, FourStagesMatchDataParallel) {
  expect_matches(pipeline_run(4, config(1, 0), false), plain_reference(), 4);
}

TEST(Pipeline, OneStageFourDataRanksMatchDataParallel) {
  expect_matches(pipeline_run(1, config(4, 0), false), plain_reference(), 1);
}

TEST(Pipeline, ZeroOneAndTwoAcrossTheDataGroups) {
  expect_matches(pipeline_run(2, config(2, 1), false), plain_reference(), 2);
  expect_matches(pipeline_run(2, config(2, 2), false), plain_reference(), 2);
}

// ZeRO-2 under the pipeline reduces a stage's gradients once per batch (after the last
// micro-batch's backward), not once per micro-batch: the reduce-scatter calls of a batch of 4
// micro-batches equal those of a batch of 1.
TEST(Pipeline, ZeroTwoReducesOncePerBatch) {
  auto calls = [](int gas) {
    int64_t n = -1;
    std::mutex mu;
    run_ranks(kWorld, [&](deepspeed::comm::CommunicatorPtr comm) {
      dp::PipelineInitializeArgs args;
      args.model = gpt::gpt_pipeline(tiny_gpt(false));
      args.model.num_stages = 2;
      args.config_json = config(2, 2);
      args.config_json["gradient_accumulation_steps"] = gas;
      args.comm = comm;
      args.device = "cpu";
      auto engine = dp::initialize_pipeline(args);
      int m = 0;
      auto& dpc = *engine->communicator();
      dpc.reset_stats();
      engine->train_batch([&] { return pipeline_micro_batch(0, m++); });
      int64_t c = 0;
      for (auto& [kind, st] : dpc.stats())
        if (kind.find("reduce_scatter") != std::string::npos) c += st.calls;
      std::lock_guard<std::mutex> lock(mu);
      if (comm->rank() == 0) n = c;
    });
    return n;
  };
  const int64_t one = calls(1), four = calls(4);
  EXPECT_GT(one, 0);
  EXPECT_EQ(four, one);
}

TEST(Pipeline, ClippingUsesTheNormOverAllStages) {
  // 0.05 is far below the gradient norm of this model: every step is clipped.
  auto ref = reference_losses(false, 0.05);
  auto run = pipeline_run(2, config(2, 1, 0.05), false);
  expect_matches(run, ref, 2);
  EXPECT_GT(run.grad_norm[0], 0.05);
  // Clipping changes the losses (so a wrong norm, e.g. each stage clipping by its own, would
  // show): the same run unclipped (clipping 1e9: SGD, never active) parts from the clipped one.
  EXPECT_GT(dstest::max_rel_diff(ref, reference_losses(false, 1e9)), 1e-3);
}

// An LR schedule steps once per train_batch, as once per optimizer step without the pipeline:
// warm-up from 0 over 2 steps then decay, the same losses as the data-parallel reference (which
// differ from the constant-LR ones, so a schedule ignored or stepped per micro-batch would show).
TEST(Pipeline, LrScheduleStepsOncePerBatch) {
  const nlohmann::json sched = {
      {"scheduler",
       {{"type", "WarmupDecayLR"},
        {"params", {{"warmup_min_lr", 0.0}, {"warmup_max_lr", 3e-3}, {"warmup_num_steps", 2},
                    {"total_num_steps", 6}}}}}};
  auto ref = reference_losses(false, 0.0, sched);
  auto cfg = config(2, 1);
  cfg.merge_patch(sched);
  expect_matches(pipeline_run(2, cfg, false), ref, 2);
  EXPECT_GT(dstest::max_rel_diff(ref, plain_reference()), 1e-4);
}

TEST(Pipeline, TiedEmbeddingAndHead) {
  auto ref = reference_losses(true, 0.05);
  expect_matches(pipeline_run(2, config(2, 1, 0.05), true), ref, 2);
  expect_matches(pipeline_run(4, config(1, 0, 0.05), true), ref, 4);
}

// activation_checkpoint_interval: segments of 1 and 2 layers recomputed in backward give the
// same losses as without (fp32: the recomputation repeats the same operations).
TEST(Pipeline, ActivationCheckpointInterval) {
  for (int interval : {1, 2}) {
    auto cfg = config(2, 1);
    cfg["pipeline"] = {{"activation_checkpoint_interval", interval}};
    deepspeed::checkpointing::reset_stats();
    auto run = pipeline_run(2, cfg, false);
    // The interval really checkpointed (the losses alone would also match if it were ignored).
    EXPECT_GT(deepspeed::checkpointing::stats().recomputes, 0) << interval;
    expect_matches(run, plain_reference(), 2);
    EXPECT_EQ(run.losses[0], pipeline_run(2, config(2, 1), false).losses[0]) << interval;
  }
}

// eval_batch over two stages with activations whose shape changes between micro-batches
// (dynamic_shape: the shape metadata goes before every activation, not only the first): every
// rank returns the mean micro-batch loss of the same layers as one module. Without the metadata
// per activation the receiver would post a buffer of the first micro-batch's size.
TEST(Pipeline, EvalBatchWithChangingShapesOnTwoStages) {
  // Micro-batch g cut to 8 - g % 4 tokens: four sequence lengths, so four activation shapes.
  auto micro = [](int g) {
    auto [x, y] = pipeline_micro_batch(0, g);
    const int64_t tokens = 8 - g % 4;
    return dp::MicroBatch{x.slice(1, 0, tokens).contiguous(), y.slice(1, 0, tokens).contiguous()};
  };
  double expected = 0.0;
  {
    torch::NoGradGuard no_grad;
    dp::PipelineSequentialImpl reference(gpt::gpt_pipeline(tiny_gpt(false)), 5);
    for (int g = 0; g < kGlobalMicro; ++g) {
      auto [x, y] = micro(g);
      expected += reference.forward(x, y).item<double>() / kGlobalMicro;
    }
  }
  std::vector<double> losses(2);
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    dp::PipelineInitializeArgs args;
    args.model = gpt::gpt_pipeline(tiny_gpt(false));
    args.model.num_stages = 2;
    args.config_json = config(1, 0);  // one data rank: the 8 micro-batches all pass through
    args.comm = comm;
    args.device = "cpu";
    args.dynamic_shape = true;
    auto engine = dp::initialize_pipeline(args);
    int m = 0;
    losses[comm->rank()] = engine->eval_batch([&] { return micro(m++); });
  });
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_NEAR(losses[rank], expected, dstest::kLossTol * expected) << "rank " << rank;
}

// Without dynamic_shape the shape travels once: an activation of another shape (here the second
// micro-batch, one token shorter) is refused by its sender, naming the switch, instead of being
// sent into the next stage's buffer of the first shape. The next stage's receive fails with it
// (its peer's communicator closes).
TEST(PipelineErrors, AChangedActivationShapeWithoutDynamicShapeNamesIt) {
  std::vector<std::string> messages(2);
  auto run = [&] {
    run_ranks(
        2,
        [&](deepspeed::comm::CommunicatorPtr comm) {
          dp::PipelineInitializeArgs args;
          args.model = gpt::gpt_pipeline(tiny_gpt(false));
          args.model.num_stages = 2;
          args.config_json = config(1, 0);
          args.comm = comm;
          args.device = "cpu";
          auto engine = dp::initialize_pipeline(args);
          int m = 0;
          try {
            engine->eval_batch([&] {
              auto [x, y] = pipeline_micro_batch(0, m);
              const int64_t tokens = 8 - (m++ > 0 ? 1 : 0);
              return dp::MicroBatch{x.slice(1, 0, tokens).contiguous(),
                                    y.slice(1, 0, tokens).contiguous()};
            });
          } catch (const std::exception& e) {
            messages[comm->rank()] = e.what();
            throw;  // closes this rank's communicator, as a real failure would
          }
        },
        std::chrono::seconds(10));
  };
  EXPECT_ANY_THROW(run());
  EXPECT_CONTAINS(messages[0], "pipeline stage 0: an activation of shape");
  EXPECT_CONTAINS(messages[0], "PipelineInitializeArgs.dynamic_shape");
}

// NVMe optimizer offload under the pipeline: every stage swaps its own partition through one
// nvme_path (stages share data-parallel ranks, so their swap files must not collide) and the
// losses are bit-identical to the in-memory run, as without the pipeline.
TEST(Pipeline, NvmeOptimizerOffloadMatchesInMemory) {
  dstest::TempDir dir("ds_pipe_nvme", dstest::TempDir::Base::kDisk);
  auto in_memory = pipeline_run(2, config(2, 1), false, 4);
  auto cfg = config(2, 1);
  cfg["zero_optimization"]["offload_optimizer"] = {{"device", "nvme"}, {"nvme_path", dir.path()}};
  auto swapped = pipeline_run(2, cfg, false, 4);
  for (int rank = 0; rank < kWorld; ++rank) EXPECT_EQ(swapped.losses[rank], in_memory.losses[rank]);
}

// A training batch that throws midway is retried whole, so it must leave nothing of itself in
// the gradients: neither the .grad its finished micro-batches accumulated, nor what its boundary
// backward had reduced into the ZeRO stage's partition before throwing. Pipe 1 x data 4 (every
// rank fails at the same point, so no transfer is left out of step), ZeRO 0-2: the run with batch
// 1 failing once and retried trains exactly as the run without the failure.
namespace {
enum class BatchFailure { kLoadingTheLastMicroBatch, kInTheBoundaryBackward };

std::vector<double> losses_with_a_failed_batch(int zero_stage, std::optional<BatchFailure> fail) {
  constexpr int kFailingBatch = 1;
  const int gas = kGlobalMicro / kWorld;
  std::vector<double> losses;
  std::mutex mu;
  run_ranks(kWorld, [&](deepspeed::comm::CommunicatorPtr comm) {
    // Set when the boundary micro-batch of the failing attempt is loaded: its backward throws
    // midway, in a pass-through layer between the blocks.
    bool arm_backward = false;
    dp::PipelineInitializeArgs args;
    args.model = gpt::gpt_pipeline(tiny_gpt(false));
    args.model.layers.insert(
        args.model.layers.begin() + 3, dp::Lambda("throws_in_backward", [&](const at::Tensor& x) {
          if (arm_backward && x.requires_grad()) {
            arm_backward = false;
            x.register_hook([](const at::Tensor&) -> at::Tensor {
              throw std::runtime_error("injected failure in the boundary backward");
            });
          }
          return x;
        }));
    args.model.num_stages = 1;
    args.config_json = config(kWorld, zero_stage);
    args.comm = comm;
    args.device = "cpu";
    auto engine = dp::initialize_pipeline(args);
    std::vector<double> mine;
    for (int k = 0; k < kSteps; ++k) {
      const bool failing = fail && k == kFailingBatch;
      int m = 0;
      auto data = [&] {
        if (failing && m == gas - 1) {
          if (*fail == BatchFailure::kLoadingTheLastMicroBatch)
            throw std::runtime_error("injected failure loading a micro-batch");
          arm_backward = true;
        }
        return pipeline_micro_batch(k, (m++) * kWorld + comm->rank());
      };
      if (failing) EXPECT_ANY_THROW(engine->train_batch(data));
      m = 0;
      arm_backward = false;
      mine.push_back(engine->train_batch([&] {
        return pipeline_micro_batch(k, (m++) * kWorld + comm->rank());
      }));
    }
    std::lock_guard<std::mutex> lock(mu);
    if (comm->rank() == 0) losses = mine;
  });
  return losses;
}
}  // namespace

TEST(Pipeline, AFailedBatchLeavesNothingInTheGradientsOfItsRetry) {
  for (int stage : {0, 1, 2}) {
    const auto clean = losses_with_a_failed_batch(stage, std::nullopt);
    ASSERT_EQ(clean.size(), static_cast<size_t>(kSteps));
    for (auto fail : {BatchFailure::kLoadingTheLastMicroBatch, BatchFailure::kInTheBoundaryBackward})
      EXPECT_EQ(losses_with_a_failed_batch(stage, fail), clean)
          << "stage " << stage << ", failure " << static_cast<int>(fail);
  }
}

// At stage 0 too, where a bf16 engine would sum its micro-steps in fp32: a pipeline's micro-batches
// accumulate in the parameters' .grad (only the last backward runs through the stage), so its
// gradient buffer stays bf16, the parameters' size. (Before, it also kept an fp32 buffer that
// summed only the last micro-batch in fp32: 6 bytes of gradients per parameter.)
TEST(Pipeline, Bf16Trains) {
  for (int stage : {0, 1}) {
    auto cfg = config(2, stage, 1.0);
    cfg["bf16"] = {{"enabled", true}};
    auto run = pipeline_run(2, cfg, false, 4);
    // bf16 rounds differently from the fp32 reference: a loose agreement, and it trains.
    EXPECT_LT(dstest::max_rel_diff({run.losses[0][0]}, {plain_reference()[0]}), 2e-2);
    EXPECT_LT(run.losses[0].back(), run.losses[0].front());
    for (int rank = 1; rank < kWorld; ++rank) EXPECT_EQ(run.losses[rank], run.losses[0]);
    for (int rank = 0; rank < kWorld; ++rank)
      EXPECT_EQ(run.memory[rank].gradients, run.memory[rank].parameters)
          << "stage " << stage << ", rank " << rank;
  }
}

// fp16 with dynamic loss scaling: a pipeline of linear layers whose parameters are fp16 and
// whose compute is fp32 (libtorch 1.13 has no Half matmul on the CPU). Started at 2^32, the
// scale overflows the first steps; the overflow vote spans every stage (PipeStage's global norm),
// so all ranks skip the same steps and keep the same scale, and training ends near the same
// layers trained as one module at world 4. (This test found NaN norms read as 0 across stages,
// which applied the overflowed steps.)
namespace {
struct HalfLinearImpl : torch::nn::Module {
  explicit HalfLinearImpl(int64_t in, int64_t out) {
    w = register_parameter("w", (torch::randn({out, in}) * (1.0 / std::sqrt(in))).to(torch::kHalf));
    b = register_parameter("b", torch::zeros({out}, torch::kHalf));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::tanh(x.to(torch::kFloat).matmul(w.to(torch::kFloat).t()) + b.to(torch::kFloat));
  }
  torch::Tensor w, b;
};
TORCH_MODULE(HalfLinear);

dp::PipelineModule half_mlp() {
  dp::PipelineModule m;
  for (int i = 0; i < 4; ++i)
    m.layers.emplace_back("half_linear", [] { return torch::nn::AnyModule(HalfLinear(16, 16)); });
  m.loss_fn = [](const at::Tensor& out, const at::Tensor& y) { return (out - y).pow(2).mean(); };
  return m;
}

dp::MicroBatch regression_batch(int step, int g) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(77);
  auto teacher = torch::randn({16, 16}, gen) * 0.5;
  auto x = torch::randn({4, 16}, at::make_generator<at::CPUGeneratorImpl>(1000 * step + g + 1));
  return {x, torch::tanh(x.matmul(teacher))};
}

nlohmann::json fp16_config(int dp_size) {
  auto c = config(dp_size, 1);
  c["train_micro_batch_size_per_gpu"] = 4;
  c["optimizer"]["params"]["lr"] = 1e-2;
  c["fp16"] = {{"enabled", true}, {"initial_scale_power", 32}};
  return c;
}

struct Fp16Outcome {
  std::vector<double> applied_losses;
  int64_t skipped = -1;
  double scale = 0.0;
};
}  // namespace

TEST(Pipeline, Fp16DynamicLossScalingAgreesAcrossStages) {
  constexpr int kFp16Steps = 30;
  Fp16Outcome ref;
  std::mutex mu;
  run_ranks(kWorld, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto model = std::make_shared<dp::PipelineSequentialImpl>(half_mlp(), 5);
    deepspeed::InitializeArgs<dp::PipelineSequentialImpl> args;
    args.model = model;
    args.config_json = fp16_config(kWorld);
    args.comm = comm;
    args.device = "cpu";
    auto engine = deepspeed::initialize(args).engine;
    Fp16Outcome mine;
    for (int k = 0; k < kFp16Steps; ++k) {
      for (int m = 0; m < kGlobalMicro / kWorld; ++m) {
        auto [x, y] = regression_batch(k, m * kWorld + comm->rank());
        engine->backward(engine->forward(x, y));
        engine->step();
      }
      if (engine->was_step_applied()) mine.applied_losses.push_back(engine->last_loss());
    }
    mine.skipped = engine->skipped_steps();
    mine.scale = engine->loss_scale();
    std::lock_guard<std::mutex> lock(mu);
    if (comm->rank() == 0) ref = mine;
  });
  std::vector<Fp16Outcome> runs(kWorld);
  testing::internal::CaptureStdout();
  run_ranks(kWorld, [&](deepspeed::comm::CommunicatorPtr comm) {
    dp::PipelineInitializeArgs args;
    args.model = half_mlp();
    args.model.num_stages = 2;
    args.config_json = fp16_config(2);
    args.comm = comm;
    args.device = "cpu";
    auto engine = dp::initialize_pipeline(args);
    const int data_rank = comm->rank() % 2;
    Fp16Outcome mine;
    for (int k = 0; k < kFp16Steps; ++k) {
      int m = 0;
      const double loss =
          engine->train_batch([&] { return regression_batch(k, (m++) * 2 + data_rank); });
      if (engine->was_step_applied()) mine.applied_losses.push_back(loss);
    }
    mine.skipped = engine->skipped_steps();
    mine.scale = engine->loss_scale();
    runs[comm->rank()] = mine;
  });
  const std::string printed = testing::internal::GetCapturedStdout();
  EXPECT_GT(ref.skipped, 0);
  // One OVERFLOW line per skipped step for the whole job, not one per stage.
  int64_t overflow_lines = 0;
  for (size_t at = printed.find("OVERFLOW!"); at != std::string::npos;
       at = printed.find("OVERFLOW!", at + 1))
    ++overflow_lines;
  EXPECT_EQ(overflow_lines, runs[0].skipped) << printed;
  for (int rank = 0; rank < kWorld; ++rank) {
    EXPECT_EQ(runs[rank].skipped, runs[0].skipped) << "rank " << rank;
    EXPECT_EQ(runs[rank].scale, runs[0].scale) << "rank " << rank;
    EXPECT_EQ(runs[rank].applied_losses, runs[0].applied_losses) << "rank " << rank;
  }
  // fp16 gradients are accumulated over 4 micro-batches per rank here and 2 in the reference, so
  // the step where the shrinking scale first fits can differ by one (measured: 14 vs 15 skips).
  EXPECT_GT(runs[0].skipped, 0);
  EXPECT_LE(std::abs(runs[0].skipped - ref.skipped), 1);
  ASSERT_GT(runs[0].applied_losses.size(), 5u);
  for (double loss : runs[0].applied_losses) EXPECT_TRUE(std::isfinite(loss));
  EXPECT_LT(dstest::max_rel_diff({runs[0].applied_losses.back()}, {ref.applied_losses.back()}), 5e-2);
  EXPECT_LT(runs[0].applied_losses.back(), 0.7 * runs[0].applied_losses.front());
}

// ---- bad input ----

namespace {
std::string init_error(int stages, nlohmann::json cfg, gpt::GPTConfig model, int world = kWorld,
                       bool from_config = false) {
  std::string message;
  std::mutex mu;
  try {
    run_ranks(world, [&](deepspeed::comm::CommunicatorPtr comm) {
      dp::PipelineInitializeArgs args;
      args.model = gpt::gpt_pipeline(model);
      if (!from_config) args.model.num_stages = stages;
      args.config_json = cfg;
      args.comm = comm;
      args.device = "cpu";
      dp::initialize_pipeline(args);
    }, std::chrono::seconds(5));
  } catch (const std::exception& e) {
    message = e.what();
  }
  return message;
}
}  // namespace

// A step that throws before completing (here: an fp16 overflow with the loss scale already at
// min_loss_scale) counts none of the batch's micro-steps, so a retried batch ends on the
// accumulation boundary again. Before, the batch's first gas - 1 stayed counted and every later
// batch ended off the boundary: it never stepped again.
TEST(PipelineErrors, AStepThatThrewCountsNoMicroStep) {
  run_ranks(kWorld, [&](deepspeed::comm::CommunicatorPtr comm) {
    dp::PipelineInitializeArgs args;
    args.model = half_mlp();
    args.model.num_stages = 1;
    args.config_json = fp16_config(kWorld);
    args.config_json["fp16"]["min_loss_scale"] = std::pow(2.0, 32);  // 2^32 overflows in fp16
    args.config_json["fp16"]["hysteresis"] = 1;  // the first overflow lowers the scale
    args.comm = comm;
    args.device = "cpu";
    auto engine = dp::initialize_pipeline(args);
    ASSERT_GT(engine->gradient_accumulation_steps(), 1);
    for (int attempt = 0; attempt < 2; ++attempt) {
      int m = 0;
      try {
        engine->train_batch([&] { return regression_batch(0, (m++) * kWorld + comm->rank()); });
        ADD_FAILURE() << "the overflow at the minimum loss scale went through";
      } catch (const deepspeed::Error& e) {
        EXPECT_NE(std::string(e.what()).find("already at minimum"), std::string::npos) << e.what();
      }
      EXPECT_EQ(engine->micro_steps(), 0) << "attempt " << attempt;
    }
  });
}

TEST(PipelineErrors, WorldNotDivisibleByStages) {
  auto cfg = config(1, 0);
  cfg["pipeline"] = {{"stages", 3}};
  auto msg = init_error(3, cfg, tiny_gpt(false), kWorld, /*from_config=*/true);
  EXPECT_NE(msg.find("pipeline.stages = 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("world size 4"), std::string::npos) << msg;
  // The count from the module: its key is named.
  msg = init_error(3, config(1, 0), tiny_gpt(false));
  EXPECT_CONTAINS(msg, "PipelineModule.num_stages = 3");
  EXPECT_CONTAINS(msg, "world size 4");
}

TEST(PipelineErrors, MoreStagesThanLayers) {
  auto model = tiny_gpt(false);
  model.n_layer = 1;  // 4 layers: embedding, block, ln_f, head
  auto msg = init_error(8, config(1, 0), model, 8);  // the count from PipelineModule.num_stages
  EXPECT_CONTAINS(msg, "PipelineModule.num_stages = 8");
  EXPECT_NE(msg.find("4 layers"), std::string::npos) << msg;
}

TEST(PipelineErrors, TiedLayerOnOneStageOnly) {
  // 2 stages of a 1-block tied model by "uniform": [embed, block | ln_f, head] spans both; with
  // the type partition only on blocks, the cut leaves both tied layers... use a direct module.
  dp::PipelineModule m = gpt::gpt_pipeline(tiny_gpt(true));
  // Move the second tied use right after the first: both land on stage 0 of 2.
  std::swap(m.layers[1], m.layers.back());
  std::string message;
  try {
    run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
      dp::PipelineInitializeArgs args;
      args.model = m;
      args.model.num_stages = 2;
      args.model.partition_method = "uniform";
      args.config_json = config(1, 0);
      args.comm = comm;
      args.device = "cpu";
      dp::initialize_pipeline(args);
    }, std::chrono::seconds(5));
  } catch (const std::exception& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("TiedLayerSpec \"embed\""), std::string::npos) << message;
  EXPECT_NE(message.find("stage 0"), std::string::npos) << message;
}

// Tied gradients are summed between stages after the backward's reduction; an offloaded
// optimizer that takes its ranges during that reduction (overlap_step) would update each stage's
// copy with its own part and the copies would drift apart: refused. Without overlap_step it trains.
TEST(PipelineErrors, TiedLayersWithTheOffloadedUpdateDuringBackwardAreRefused) {
  auto cfg = config(2, 1);
  cfg["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}, {"overlap_step", true}};
  auto msg = init_error(2, cfg, tiny_gpt(true));
  EXPECT_NE(msg.find("TiedLayerSpec"), std::string::npos) << msg;
  EXPECT_NE(msg.find("overlap_step"), std::string::npos) << msg;
  cfg["zero_optimization"]["offload_optimizer"]["overlap_step"] = false;
  EXPECT_EQ(init_error(2, cfg, tiny_gpt(true)), "");
  // Three stages: the middle one holds no tied layer and refuses too (else it would wait for its
  // neighbours' first transfer until the timeout).
  auto three = config(1, 1);
  three["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}, {"overlap_step", true}};
  std::vector<std::string> refused(3);
  run_ranks(3, [&](deepspeed::comm::CommunicatorPtr comm) {
    dp::PipelineInitializeArgs args;
    args.model = gpt::gpt_pipeline(tiny_gpt(true));
    args.model.num_stages = 3;
    args.config_json = three;
    args.comm = comm;
    args.device = "cpu";
    refused[comm->rank()] = dstest::message_of<deepspeed::ConfigError>(
        [&] { dp::initialize_pipeline(args); });
  }, std::chrono::seconds(20));
  for (int r = 0; r < 3; ++r) EXPECT_CONTAINS(refused[r], "overlap_step") << "rank " << r;
}

TEST(PipelineErrors, ZeroThreeRefusedNamingBothKeys) {
  auto msg = init_error(2, config(2, 3), tiny_gpt(false));
  EXPECT_NE(msg.find("zero_optimization.stage = 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("pipeline"), std::string::npos) << msg;
}

TEST(PipelineErrors, PartitionTypeMatchingNothing) {
  dp::PipelineModule m = gpt::gpt_pipeline(tiny_gpt(false));
  m.num_stages = 1;
  m.partition_method = "type:Transformer";
  std::string message;
  try {
    dp::PipelineInitializeArgs args;
    args.model = m;
    args.config_json = config(1, 0);
    args.comm = deepspeed::comm::make_single_process_communicator();
    args.device = "cpu";
    dp::initialize_pipeline(args);
  } catch (const deepspeed::ConfigError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("type:Transformer"), std::string::npos) << message;
  EXPECT_NE(message.find("BlockImpl"), std::string::npos) << message;
  // The method came from the module: its key is named, not the config's.
  EXPECT_CONTAINS(message, "PipelineModule.partition_method = \"type:Transformer\"");
  // From the config: pipeline.partition is named.
  m.partition_method.clear();
  auto cfg = config(1, 0);
  cfg["pipeline"] = {{"partition", "Sideways"}};
  message = dstest::message_of<deepspeed::ConfigError>([&] {
    dp::PipelineInitializeArgs args;
    args.model = m;
    args.config_json = cfg;
    args.comm = deepspeed::comm::make_single_process_communicator();
    args.device = "cpu";
    dp::initialize_pipeline(args);
  });
  EXPECT_CONTAINS(message, "pipeline.partition = \"sideways\"");
}

// train_batch under torch::NoGradGuard: refused by name on every rank before any transfer (no
// rank waits on another), as DeepSpeed asserts grad mode in train_batch. Before, the last stage
// failed with torch's "element 0 of tensors does not require grad" and the others waited on it.
TEST(PipelineErrors, TrainBatchWithoutGradModeNamesIt) {
  for (int stages : {1, 2}) {
    std::vector<std::string> messages(stages);
    run_ranks(stages, [&](deepspeed::comm::CommunicatorPtr comm) {
      dp::PipelineInitializeArgs args;
      args.model = gpt::gpt_pipeline(tiny_gpt(false));
      args.model.num_stages = stages;
      args.config_json = config(1, 0);
      args.comm = comm;
      args.device = "cpu";
      auto engine = dp::initialize_pipeline(args);
      torch::NoGradGuard no_grad;
      int m = 0;
      try {
        engine->train_batch([&] { return pipeline_micro_batch(0, m++); });
      } catch (const std::exception& e) {
        messages[comm->rank()] = e.what();
      }
      EXPECT_EQ(engine->micro_steps(), 0);
    }, std::chrono::seconds(10));
    for (int r = 0; r < stages; ++r) {
      EXPECT_CONTAINS(messages[r], "train_batch() requires gradients enabled")
          << stages << " stages, rank " << r;
      EXPECT_CONTAINS(messages[r], "eval_batch()") << stages << " stages, rank " << r;
    }
  }
}

TEST(PipelineErrors, PerMicroBatchLoopRefused) {
  dp::PipelineInitializeArgs args;
  args.model = gpt::gpt_pipeline(tiny_gpt(false));
  args.model.num_stages = 1;
  args.model.partition_method = "type:block";  // a partition by type that matches
  args.config_json = config(1, 0);
  args.comm = deepspeed::comm::make_single_process_communicator();
  args.device = "cpu";
  auto engine = dp::initialize_pipeline(args);
  EXPECT_THROW(engine->forward(torch::zeros({1})), deepspeed::Error);
  EXPECT_THROW(engine->backward(torch::zeros({1})), deepspeed::Error);
  EXPECT_THROW(engine->step(), deepspeed::Error);
  // eval_batch: forward only, the mean loss of the micro-batches.
  int m = 0;
  double loss = engine->eval_batch([&] { return pipeline_micro_batch(0, m++); });
  EXPECT_EQ(m, kGlobalMicro);
  EXPECT_GT(loss, 3.0);  // about ln(64) = 4.16 untrained
  EXPECT_LT(loss, 5.5);
}

// --- The layer split at engine level (engine->partition()) -----------------------------------

namespace {

// Trainable parameters of each layer of gpt_pipeline(c), counted by hand from the shapes (not by
// the library's layer_weights): [embedding, block x n_layer, ln_f, head].
//   embedding  wte V x C + wpe T x C
//   block      ln1 2C + qkv (3C^2 + 3C) + proj (C^2 + C) + ln2 2C + fc (4C^2 + 4C) + proj (4C^2 + C)
//              = 12C^2 + 13C (with biases)
//   ln_f       2C
//   head       V x C, no bias; tied: the embedding's module, counted again where it sits (DeepSpeed
//              builds and counts every spec, a TiedLayerSpec too)
std::vector<int64_t> hand_counted_parameters(const gpt::GPTConfig& c) {
  const int64_t C = c.n_embd, embedding = c.vocab_size * C + c.block_size * C;
  std::vector<int64_t> w{embedding};
  for (int64_t i = 0; i < c.n_layer; ++i) w.push_back(12 * C * C + 13 * C);
  w.push_back(2 * C);
  w.push_back(c.tie_embeddings ? embedding : c.vocab_size * C);
  return w;
}

// The exact optimum DeepSpeed's partition_balanced aims at, by brute force over every way to cut
// `w` into `stages` contiguous non-empty parts: the smallest spread between the heaviest and the
// lightest part. The cases below are chosen so that the optimum is unique (asserted), so the tie
// rule (the last cut) does not enter; independent of the library's dynamic programme.
std::vector<int64_t> best_balanced_bounds(const std::vector<int64_t>& w, int stages) {
  const int64_t n = static_cast<int64_t>(w.size());
  std::vector<int64_t> bounds(stages + 1, 0), best;
  int64_t best_spread = -1;
  int ties = 0;
  bounds[stages] = n;
  std::function<void(int)> place = [&](int s) {  // chooses bounds[s]
    if (s == stages) {
      int64_t lo = std::numeric_limits<int64_t>::max(), hi = 0;
      for (int k = 0; k < stages; ++k) {
        int64_t sum = 0;
        for (int64_t i = bounds[k]; i < bounds[k + 1]; ++i) sum += w[i];
        lo = std::min(lo, sum);
        hi = std::max(hi, sum);
      }
      if (best_spread < 0 || hi - lo < best_spread) {
        best_spread = hi - lo;
        best = bounds;
        ties = 1;
      } else if (hi - lo == best_spread) {
        ++ties;
      }
      return;
    }
    for (int64_t b = bounds[s - 1] + 1; b <= n - (stages - s); ++b) {
      bounds[s] = b;
      place(s + 1);
    }
  };
  place(1);
  EXPECT_EQ(ties, 1) << "the test's case has several best cuts: pick one with a unique optimum";
  return best;
}

// DeepSpeed's partition_uniform by hand: equal layer counts, the remainder one layer each to the
// first stages (7 layers: 4, 3 over 2 stages; 2, 2, 2, 1 over 4).
std::vector<int64_t> uniform_bounds(int64_t layers, int stages) {
  std::vector<int64_t> b{0};
  for (int s = 0; s < stages; ++s) b.push_back(b.back() + layers / stages + (s < layers % stages));
  return b;
}

// The sum of `w` over each stage of `bounds`.
std::vector<int64_t> per_stage(const std::vector<int64_t>& w, const std::vector<int64_t>& bounds) {
  std::vector<int64_t> out;
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    int64_t sum = 0;
    for (int64_t i = bounds[s]; i < bounds[s + 1]; ++i) sum += w[i];
    out.push_back(sum);
  }
  return out;
}

// Every rank's engine->partition() for `model` (its partition_method as given) on `stages`
// stages (one rank each), the config's pipeline.partition set to `config_partition` unless empty.
std::vector<dp::Partition> engine_partitions(dp::PipelineModule model, int stages,
                                             const std::string& config_partition) {
  std::vector<dp::Partition> got(stages);
  run_ranks(stages, [&](deepspeed::comm::CommunicatorPtr comm) {
    dp::PipelineInitializeArgs args = dstest::pipeline_args(comm, stages, 0, model);
    if (!config_partition.empty()) args.config_json["pipeline"] = {{"partition", config_partition}};
    got[comm->rank()] = dp::initialize_pipeline(args)->partition();
  });
  return got;
}

}  // namespace

// engine->partition() of the tiny GPT with a 256-token vocabulary (embedding 4224 and head 4096
// parameters against 3280 per block: heavy enough that "parameters" and "type:block" cut 4
// stages differently), untied and tied, at 2 and 4 stages, for each partition method given by
// the module or by the config's pipeline.partition (the module's wins; neither: "parameters",
// DeepSpeed's default). The expected bounds come from hand-counted parameters and a brute-force
// balanced cut; for the record (untied / tied alike):
//   parameters   2 stages [0, 3, 7]   4 stages [0, 1, 3, 5, 7]
//   type:block   2 stages [0, 3, 7]   4 stages [0, 2, 3, 4, 7]   (one block a stage)
//   uniform      2 stages [0, 4, 7]   4 stages [0, 2, 4, 6, 7]
// partition().parameters: the hand counts summed per stage (the tied module on both its stages).
// Catches: initialize_pipeline always cutting uniformly, layer_weights weighing every layer 1 for
// "parameters" (7 equal layers cut as uniform), "type:" weighing by parameters, pipeline.partition
// or PipelineModule.partition_method ignored, the module's method not winning over the config's,
// a wrong per-stage parameter count.
TEST(PipelineEnginePartition, EngineBoundsFollowTheMethodAndTheConfig) {
  for (bool tied : {false, true}) {
    gpt::GPTConfig c = tiny_gpt(tied);
    c.vocab_size = 256;
    const std::vector<int64_t> params = hand_counted_parameters(c);
    const int64_t layers = static_cast<int64_t>(params.size());
    std::vector<int64_t> blocks(layers, 0);  // "type:block": 1 for gpt::BlockImpl, 0 otherwise
    for (int64_t i = 1; i <= c.n_layer; ++i) blocks[i] = 1;
    for (int stages : {2, 4}) {
      struct Case {
        std::string module_method, config_partition;
        std::vector<int64_t> want;
      };
      const auto by_parameters = best_balanced_bounds(params, stages);
      const auto by_blocks = best_balanced_bounds(blocks, stages);
      const auto uniform = uniform_bounds(layers, stages);
      // The cases tell the methods apart: "parameters" differs from "uniform" at both counts, and
      // from "type:block" at 4 stages.
      EXPECT_NE(by_parameters, uniform);
      if (stages == 4) EXPECT_NE(by_parameters, by_blocks);
      const std::vector<Case> cases = {
          {"", "", by_parameters},  // DeepSpeed's default
          {"parameters", "", by_parameters},
          {"uniform", "", uniform},
          {"type:block", "", by_blocks},
          {"", "uniform", uniform},
          {"", "type:block", by_blocks},
          {"", "Parameters", by_parameters},  // names are case-insensitive
          {"uniform", "type:block", uniform},  // the module's method wins
      };
      for (const Case& k : cases) {
        dp::PipelineModule model = gpt::gpt_pipeline(c);
        model.partition_method = k.module_method;
        const std::string what = std::string(tied ? "tied" : "untied") + ", " +
                                 std::to_string(stages) + " stages, module \"" + k.module_method +
                                 "\", config \"" + k.config_partition + "\"";
        const auto got = engine_partitions(model, stages, k.config_partition);
        for (int r = 0; r < stages; ++r) {
          EXPECT_EQ(got[r].bounds, k.want) << what << ", rank " << r;
          EXPECT_EQ(got[r].parameters, per_stage(params, k.want)) << what << ", rank " << r;
        }
      }
    }
  }
}

}  // namespace pipeline_test
