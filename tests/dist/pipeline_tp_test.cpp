// Tensor parallelism inside pipeline stages (world = pipe x data x tensor): the example GPT as
// gpt::gpt_tp_pipeline on pipe 2 x tensor 2 (x data 1) gives the per-step losses and gradient
// norms of the same layers trained as one module with ZeRO stage 0 at world 4 (the same global
// batch), fp32, with clipping active at every step, so a norm that counts a split parameter per
// tensor rank, a replicated one twice or a stage's alone changes the losses. Also pipe 2 x data 2
// through an explicit topology, tied embeddings across the first and last stage, and a topology
// that does not fit the stages refused by name. (Checkpoints: tp_pipeline_checkpoint_test.cpp.)
#include <gtest/gtest.h>

#include <mutex>

#include "deepspeed/checkpointing.h"
#include "deepspeed/engine.h"
#include "deepspeed/errors.h"
#include "deepspeed/pipe.h"
#include "deepspeed/topology.h"
#include "gpt/pipeline_model.h"
#include "gpt/tp_pipeline_model.h"
#include "support/pipeline_gpt.h"
#include "support/ranks.h"
#include "support/training_run.h"

namespace pipeline_tp_test {

namespace dp = deepspeed::pipe;

namespace {

constexpr int kWorld = dstest::kPipeWorld;
constexpr int kGlobalMicro = dstest::kPipeGlobalMicro;
constexpr int kSteps = 10;
constexpr double kClip = 0.05;  // far below this model's gradient norm: every step is clipped

struct Trained {
  std::vector<std::vector<double>> losses, norms;  // per rank, per step
  std::vector<int64_t> sent_bytes;                 // per rank: sends between stages
};

// The same layers as one module, ZeRO stage 0 at world 4 (pipeline_test.cpp's reference).
Trained reference(bool tied) {
  Trained out;
  out.losses.resize(kWorld);
  out.norms.resize(kWorld);
  run_ranks(kWorld, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto model = std::make_shared<dp::PipelineSequentialImpl>(
        gpt::gpt_pipeline(dstest::tiny_pipeline_gpt(tied)), 5);
    deepspeed::InitializeArgs<dp::PipelineSequentialImpl> args;
    args.model = model;
    args.config_json = dstest::pipeline_config(kWorld, 0, kClip);
    args.comm = comm;
    args.device = "cpu";
    auto engine = deepspeed::initialize(args).engine;
    const int gas = kGlobalMicro / kWorld;
    for (int k = 0; k < kSteps; ++k) {
      for (int m = 0; m < gas; ++m) {
        auto [x, y] = dstest::pipeline_micro_batch(k, m * kWorld + comm->rank());
        engine->backward(engine->forward(x, y));
        engine->step();
      }
      out.losses[comm->rank()].push_back(engine->last_loss());
      out.norms[comm->rank()].push_back(engine->get_global_grad_norm());
    }
  });
  return out;
}

// pipe `stages` x tensor `tensor` x data (the rest) over an explicit topology; `stage`: ZeRO.
Trained pipeline(int stages, int tensor, int zero, bool tied,
                 const nlohmann::json& patch = nlohmann::json::object()) {
  Trained out;
  out.losses.resize(kWorld);
  out.norms.resize(kWorld);
  out.sent_bytes.resize(kWorld);
  run_ranks(kWorld, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto topology = std::make_shared<deepspeed::comm::Topology>(
        comm, deepspeed::comm::TopologySizes{stages, tensor});
    const int data = topology->grid().data_size();
    dp::PipelineInitializeArgs args;
    const auto c = dstest::tiny_pipeline_gpt(tied);
    args.model =
        tensor > 1 ? gpt::gpt_tp_pipeline(c, topology->tensor_parallel()) : gpt::gpt_pipeline(c);
    args.model.num_stages = stages;
    args.config_json = dstest::pipeline_config(data, zero, kClip);
    args.config_json.merge_patch(patch);
    args.topology = topology;
    args.device = "cpu";
    auto engine = dp::initialize_pipeline(args);
    const int d = topology->coordinates().data;
    for (int k = 0; k < kSteps; ++k) {
      int m = 0;
      auto next = [&] { return dstest::pipeline_micro_batch(k, (m++) * data + d); };
      out.losses[comm->rank()].push_back(engine->train_batch(next));
      out.norms[comm->rank()].push_back(engine->get_global_grad_norm());
    }
    out.sent_bytes[comm->rank()] = topology->pipe_parallel()->stats()["send"].bytes;
  });
  return out;
}

void expect_matches(const Trained& got, const Trained& ref, const std::string& layout) {
  const auto& want = ref.losses[0];
  ASSERT_EQ(want.size(), size_t(kSteps));
  ASSERT_GT(ref.norms[0].front(), kClip) << "clipping must be active for the norm to matter";
  for (int rank = 0; rank < kWorld; ++rank) {
    ASSERT_EQ(got.losses[rank].size(), want.size()) << layout;
    EXPECT_LT(dstest::max_rel_diff(got.losses[rank], want), dstest::kLossTol)
        << layout << ", rank " << rank << ": step-0 loss " << got.losses[rank][0] << " vs "
        << want[0] << ", last " << got.losses[rank].back() << " vs " << want.back();
    EXPECT_LT(dstest::max_rel_diff(got.norms[rank], ref.norms[0]), 1e-4)
        << layout << ", rank " << rank << ": step-0 norm " << got.norms[rank][0] << " vs "
        << ref.norms[0][0];
  }
  std::printf("%s: losses within %.2e relative, norms within %.2e (norm %.4f, final loss %.4f)\n",
              layout.c_str(), dstest::max_rel_diff(got.losses[0], want),
              dstest::max_rel_diff(got.norms[0], ref.norms[0]), got.norms[0][0],
              got.losses[0].back());
}

}  // namespace

TEST(PipelineTensorParallel, PipeTwoTensorTwoMatchesStage0AtWorld4) {
  const Trained ref = reference(false);
  expect_matches(pipeline(2, 2, 0, false), ref, "pipe 2 x tensor 2 x data 1, ZeRO-0");
  expect_matches(pipeline(2, 2, 1, false), ref, "pipe 2 x tensor 2 x data 1, ZeRO-1");
  // The topology path without tensor parallelism still trains pipe x data as before.
  expect_matches(pipeline(2, 1, 1, false), ref, "pipe 2 x tensor 1 x data 2, ZeRO-1");
}

// pipe_partitioned / grad_partitioned (on by default, as DeepSpeed's): each tensor rank sends
// half of every activation and gradient between the stages and the receiving stage all-gathers
// them over its tensor group. The activations and gradients crossing a stage boundary are the
// same on both tensor ranks, so training is bit for bit that of whole sends, at half the bytes.
TEST(PipelineTensorParallel, SlicedSendsBetweenStagesTrainAsWholeOnes) {
  const Trained sliced = pipeline(2, 2, 1, false);
  const Trained whole = pipeline(
      2, 2, 1, false, {{"pipeline", {{"pipe_partitioned", false}, {"grad_partitioned", false}}}});
  const Trained activations_only =
      pipeline(2, 2, 1, false, {{"pipeline", {{"grad_partitioned", false}}}});
  for (int rank = 0; rank < kWorld; ++rank) {
    EXPECT_EQ(sliced.losses[rank], whole.losses[rank]) << "rank " << rank;
    EXPECT_EQ(activations_only.losses[rank], whole.losses[rank]) << "rank " << rank;
    // Stage 0 sends activations, stage 1 gradients: each half (stage 0 also its shape message).
    EXPECT_GT(whole.sent_bytes[rank], 0) << "rank " << rank;
    EXPECT_LT(sliced.sent_bytes[rank], 0.55 * whole.sent_bytes[rank]) << "rank " << rank;
  }
  for (int rank = 0; rank < kWorld; ++rank)
    std::printf("rank %d sent %lld bytes to its neighbour stage whole, %lld sliced, %lld with "
                "only the activations sliced\n",
                rank, static_cast<long long>(whole.sent_bytes[rank]),
                static_cast<long long>(sliced.sent_bytes[rank]),
                static_cast<long long>(activations_only.sent_bytes[rank]));
}

// The embedding (split by vocabulary) is tied to the head across the first and last stage: its
// slices' gradients are summed between the stages per tensor rank, and counted once in the norm.
TEST(PipelineTensorParallel, TiedEmbeddingAcrossStages) {
  expect_matches(pipeline(2, 2, 1, true), reference(true), "tied, pipe 2 x tensor 2 x data 1");
}

// Segments of one layer recomputed in backward, their inputs split over the tensor group
// (partition_activations, the group set by initialize_pipeline): the same losses.
TEST(PipelineTensorParallel, PartitionedActivationCheckpoints) {
  const nlohmann::json patch = {{"pipeline", {{"activation_checkpoint_interval", 1}}},
                                {"activation_checkpointing", {{"partition_activations", true}}}};
  deepspeed::checkpointing::reset_stats();
  expect_matches(pipeline(2, 2, 1, false, patch), reference(false),
                 "checkpointed, partitioned, pipe 2 x tensor 2 x data 1");
  EXPECT_GT(deepspeed::checkpointing::stats().recomputes, 0);
}

TEST(PipelineTensorParallel, MismatchedTopologyIsRefusedByName) {
  run_ranks(kWorld, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto topology =
        std::make_shared<deepspeed::comm::Topology>(comm, deepspeed::comm::TopologySizes{2, 2});
    dp::PipelineInitializeArgs args;
    args.model =
        gpt::gpt_tp_pipeline(dstest::tiny_pipeline_gpt(false), topology->tensor_parallel());
    args.config_json = dstest::pipeline_config(1, 1);
    args.topology = topology;
    args.device = "cpu";
    args.model.num_stages = 4;
    try {
      dp::initialize_pipeline(args);
      ADD_FAILURE() << "a topology of pipe size 2 was accepted for 4 stages";
    } catch (const deepspeed::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("pipe size 2"), std::string::npos) << e.what();
    }
  });
}

}  // namespace pipeline_tp_test
