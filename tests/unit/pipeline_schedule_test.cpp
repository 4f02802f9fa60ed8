// The 1F1B schedule against orders written out by hand (not generated), the inference schedule,
// and the balanced partition.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "deepspeed/errors.h"
#include "deepspeed/pipe.h"
#include "pipe/partition_method.h"

namespace pipeline_schedule_test {

namespace dp = deepspeed::pipe;
using dp::Op;

namespace {

// The compute order of a stage: "F0 F1 B0 ..." (forwards and backwards by micro-batch).
std::string compute_order(const dp::Schedule& s) {
  std::string out;
  for (auto& tick : s.steps)
    for (auto& in : tick)
      if (in.op == Op::ForwardPass || in.op == Op::BackwardPass)
        out += (out.empty() ? "" : " ") + std::string(in.op == Op::ForwardPass ? "F" : "B") +
               std::to_string(in.micro_batch);
  return out;
}

// The same with idle ticks as "-": shows where each stage waits.
std::string timeline(const dp::Schedule& s) {
  std::string out;
  for (auto& tick : s.steps) {
    std::string t = "-";
    for (auto& in : tick)
      if (in.op == Op::ForwardPass || in.op == Op::BackwardPass)
        t = (in.op == Op::ForwardPass ? "F" : "B") + std::to_string(in.micro_batch);
    out += (out.empty() ? "" : " ") + t;
  }
  return out;
}

}  // namespace

TEST(PipelineSchedule, TwoStagesFourMicroBatchesByHand) {
  // 2 * (M + S - 1) = 10 ticks. Stage 0 warms up with S - 1 = 1 extra forward; stage 1 (last)
  // alternates from its first micro-batch on.
  EXPECT_EQ(timeline(dp::train_schedule(4, 2, 0)), "F0 - F1 B0 F2 B1 F3 B2 - B3");
  EXPECT_EQ(timeline(dp::train_schedule(4, 2, 1)), "- F0 B0 F1 B1 F2 B2 F3 B3 -");

  // Every instruction of stage 0, by hand (buffers: max(2, min(S - stage, M)) = 2).
  using I = dp::Instruction;
  std::vector<std::vector<I>> s0 = {
      {{Op::LoadMicroBatch, 0, 0}, {Op::ForwardPass, 0, 0}},
      {{Op::SendActivation, 0, 0}},
      {{Op::LoadMicroBatch, 1, 1}, {Op::ForwardPass, 1, 1}},
      {{Op::RecvGrad, 0, 0}, {Op::SendActivation, 1, 1}, {Op::BackwardPass, 0, 0}},
      {{Op::LoadMicroBatch, 0, 2}, {Op::ForwardPass, 0, 2}},
      {{Op::RecvGrad, 1, 1}, {Op::SendActivation, 0, 2}, {Op::BackwardPass, 1, 1}},
      {{Op::LoadMicroBatch, 1, 3}, {Op::ForwardPass, 1, 3}},
      {{Op::RecvGrad, 0, 2}, {Op::SendActivation, 1, 3}, {Op::BackwardPass, 0, 2}},
      {},
      {{Op::RecvGrad, 1, 3}, {Op::BackwardPass, 1, 3},
       {Op::ReduceTiedGrads}, {Op::ReduceGrads}, {Op::OptimizerStep}},
  };
  std::vector<std::vector<I>> s1 = {
      {},
      {{Op::RecvActivation, 0, 0}, {Op::LoadMicroBatch, 0, 0}, {Op::ForwardPass, 0, 0}},
      {{Op::BackwardPass, 0, 0}},
      {{Op::SendGrad, 0, 0}, {Op::RecvActivation, 1, 1}, {Op::LoadMicroBatch, 1, 1},
       {Op::ForwardPass, 1, 1}},
      {{Op::BackwardPass, 1, 1}},
      {{Op::SendGrad, 1, 1}, {Op::RecvActivation, 0, 2}, {Op::LoadMicroBatch, 0, 2},
       {Op::ForwardPass, 0, 2}},
      {{Op::BackwardPass, 0, 2}},
      {{Op::SendGrad, 0, 2}, {Op::RecvActivation, 1, 3}, {Op::LoadMicroBatch, 1, 3},
       {Op::ForwardPass, 1, 3}},
      {{Op::BackwardPass, 1, 3}},
      {{Op::SendGrad, 1, 3}, {Op::ReduceTiedGrads}, {Op::ReduceGrads}, {Op::OptimizerStep}},
  };
  auto a = dp::train_schedule(4, 2, 0), b = dp::train_schedule(4, 2, 1);
  EXPECT_EQ(a.num_buffers, 2);
  EXPECT_EQ(a.steps, s0) << a.str();
  EXPECT_EQ(b.steps, s1) << b.str();
}

TEST(PipelineSchedule, FourStagesEightMicroBatchesByHand) {
  // Warm-up forwards S - stage - 1, then one forward one backward, then the cool-down backwards.
  EXPECT_EQ(compute_order(dp::train_schedule(8, 4, 0)),
            "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  EXPECT_EQ(compute_order(dp::train_schedule(8, 4, 1)),
            "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
  EXPECT_EQ(compute_order(dp::train_schedule(8, 4, 2)),
            "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7");
  EXPECT_EQ(compute_order(dp::train_schedule(8, 4, 3)),
            "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  // With the idle ticks: 2 * (8 + 4 - 1) = 22 ticks; stage s starts at tick s.
  EXPECT_EQ(timeline(dp::train_schedule(8, 4, 0)),
            "F0 - F1 - F2 - F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 - B5 - B6 - B7");
  EXPECT_EQ(timeline(dp::train_schedule(8, 4, 3)),
            "- - - F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 - - -");
  EXPECT_EQ(dp::train_schedule(8, 4, 0).num_buffers, 4);
  EXPECT_EQ(dp::train_schedule(8, 4, 2).num_buffers, 2);
}

TEST(PipelineSchedule, ThreeStagesFiveMicroBatchesByHand) {
  EXPECT_EQ(compute_order(dp::train_schedule(5, 3, 0)), "F0 F1 F2 B0 F3 B1 F4 B2 B3 B4");
  EXPECT_EQ(compute_order(dp::train_schedule(5, 3, 1)), "F0 F1 B0 F2 B1 F3 B2 F4 B3 B4");
  EXPECT_EQ(compute_order(dp::train_schedule(5, 3, 2)), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4");
  EXPECT_EQ(timeline(dp::train_schedule(5, 3, 1)),
            "- F0 - F1 B0 F2 B1 F3 B2 F4 B3 - B4 -");
  EXPECT_EQ(dp::train_schedule(5, 3, 0).steps.size(), 14u);
}

// Every send has its receive on the neighbour in the same tick (blocking point to point).
TEST(PipelineSchedule, SendsMeetReceivesInTheSameTick) {
  for (auto [m, st] : std::vector<std::pair<int, int>>{{4, 2}, {8, 4}, {5, 3}, {1, 3}}) {
    std::vector<dp::Schedule> s;
    for (int k = 0; k < st; ++k) s.push_back(dp::train_schedule(m, st, k));
    for (int k = 0; k + 1 < st; ++k)
      for (size_t t = 0; t < s[k].steps.size(); ++t) {
        std::vector<std::pair<Op, int>> down, up;  // k -> k+1, in order
        for (auto& in : s[k].steps[t])
          if (in.op == Op::SendActivation) down.push_back({in.op, in.micro_batch});
          else if (in.op == Op::RecvGrad) up.push_back({in.op, in.micro_batch});
        std::vector<std::pair<Op, int>> down2, up2;
        for (auto& in : s[k + 1].steps[t])
          if (in.op == Op::RecvActivation) down2.push_back({Op::SendActivation, in.micro_batch});
          else if (in.op == Op::SendGrad) up2.push_back({Op::RecvGrad, in.micro_batch});
        EXPECT_EQ(down, down2) << "m=" << m << " stages=" << st << " stage " << k << " tick " << t;
        EXPECT_EQ(up, up2) << "m=" << m << " stages=" << st << " stage " << k << " tick " << t;
      }
  }
}

TEST(PipelineSchedule, InferenceByHand) {
  EXPECT_EQ(timeline(dp::inference_schedule(3, 2, 0)), "F0 F1 F2 -");
  EXPECT_EQ(timeline(dp::inference_schedule(3, 2, 1)), "- F0 F1 F2");
  auto s1 = dp::inference_schedule(3, 2, 1);
  // Stage 1 at tick 1: receive micro-batch 0, load its labels, run it.
  std::vector<dp::Instruction> t1 = {
      {Op::LoadMicroBatch, 0, 0}, {Op::RecvActivation, 0, 0}, {Op::ForwardPass, 0, 0}};
  EXPECT_EQ(s1.steps[1], t1);
  EXPECT_EQ(dp::to_string(s1.steps[1][2]), "ForwardPass(buffer=0, mb=0)");
}

// "uniform" as DeepSpeed's partition_uniform: the remainder goes to the first stages.
TEST(PipelinePartition, UniformGivesTheRemainderToTheFirstStages) {
  EXPECT_EQ(dp::partition_uniform(7, 3).bounds, (std::vector<int64_t>{0, 3, 5, 7}));
  EXPECT_EQ(dp::partition_uniform(10, 4).bounds, (std::vector<int64_t>{0, 3, 6, 8, 10}));
  EXPECT_EQ(dp::partition_uniform(4, 4).bounds, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(dp::partition_uniform(6, 1).bounds, (std::vector<int64_t>{0, 6}));
  EXPECT_THROW(dp::partition_uniform(2, 3), deepspeed::ConfigError);
}

TEST(PipelinePartition, MethodNamesAreCaseInsensitiveButNotTheirRegex) {
  EXPECT_EQ(dp::normalized_partition_method("Uniform"), "uniform");
  EXPECT_EQ(dp::normalized_partition_method("PARAMETERS"), "parameters");
  EXPECT_EQ(dp::normalized_partition_method("Best"), "parameters");
  EXPECT_EQ(dp::normalized_partition_method("Type:TransformerBlock"), "type:TransformerBlock");
}

// DeepSpeed's rule: the smallest spread (heaviest minus lightest stage), the last cut on ties.
TEST(PipelinePartition, BalancedByWeight) {
  // [10 1 1 | 1 1 10]: 12 and 12, spread 0.
  auto p = dp::partition_balanced({10, 1, 1, 1, 1, 10}, 2);
  EXPECT_EQ(p.bounds, (std::vector<int64_t>{0, 3, 6}));
  // Spread 1 either way; the last cut wins: 3, 2, 2 (the heaviest-stage rule kept 2, 2, 3).
  p = dp::partition_balanced({1, 1, 1, 1, 1, 1, 1}, 3);
  EXPECT_EQ(p.bounds, (std::vector<int64_t>{0, 3, 5, 7}));
  p = dp::partition_balanced({5, 5, 5, 5}, 4);
  EXPECT_EQ(p.bounds, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  try {
    dp::partition_balanced({1, 1}, 3);
    FAIL() << "3 stages over 2 layers must be refused";
  } catch (const deepspeed::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("num_stages = 3"), std::string::npos) << e.what();
  }
}

// The cuts DeepSpeed's runtime/utils.py partition_balanced (0.14, 0.16) makes, computed with it
// (a numpy port of its dynamic programme), so a model's stages hold the same layers as there.
TEST(PipelinePartition, BalancedMatchesDeepSpeed) {
  EXPECT_EQ(dp::partition_balanced(std::vector<int64_t>(7, 1), 3).bounds,
            (std::vector<int64_t>{0, 3, 5, 7}));
  EXPECT_EQ(dp::partition_balanced(std::vector<int64_t>(10, 1), 4).bounds,
            (std::vector<int64_t>{0, 3, 6, 8, 10}));
  // GPT-2 small's parameter counts per layer: embeddings, 12 blocks, ln_f, the head.
  std::vector<int64_t> gpt2 = {39383808};
  gpt2.insert(gpt2.end(), 12, 7087872);
  gpt2.insert(gpt2.end(), {1536, 38597376});
  EXPECT_EQ(dp::partition_balanced(gpt2, 6).bounds,
            (std::vector<int64_t>{0, 1, 4, 7, 10, 14, 15}));
  // Zero weights (a "type:" partition's unmatched layers) go where the last-cut rule puts them.
  EXPECT_EQ(dp::partition_balanced({0, 1, 1, 0}, 2).bounds, (std::vector<int64_t>{0, 2, 4}));
  EXPECT_EQ(dp::partition_balanced({0, 0, 1, 0, 1, 0}, 2).bounds,
            (std::vector<int64_t>{0, 4, 6}));
  // As many layers as stages: DeepSpeed's partition_uniform, one layer each whatever the weights.
  EXPECT_EQ(dp::partition_balanced({100, 1, 1}, 3).bounds, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(dp::partition_balanced({7}, 1).bounds, (std::vector<int64_t>{0, 1}));
}

}  // namespace pipeline_schedule_test
