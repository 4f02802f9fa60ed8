#include <gtest/gtest.h>

#include <torch/torch.h>

#include <string>

#include "deepspeed/engine.h"
#include "deepspeed/errors.h"
#include "deepspeed/memory.h"
#include "support/checkpoint_run.h"
#include "support/expect.h"
#include "support/training_run.h"
#include "util/allocation_meter.h"

namespace memory_estimate_test {

using deepspeed::estimate_zero_memory;

TEST(EstimateZeroMemory, Fp32Formulas) {
  const int64_t psi = 1000000;
  EXPECT_EQ(estimate_zero_memory(psi, 4, 0).model_states(), 16 * psi);
  // Stage 1 reduce-scatters at the boundary: stage 2's with one micro-step, and autograd's .grad
  // (4Ψ) between micro-steps with accumulation (the paper's 8Ψ + 8Ψ/N is 4Ψ/N below that).
  EXPECT_EQ(estimate_zero_memory(psi, 4, 1).model_states(), 4 * psi + 12 * psi / 4);
  EXPECT_EQ(estimate_zero_memory(psi, 4, 1, false, 1, 0, 0, false, 2).model_states(),
            8 * psi + 12 * psi / 4);
  EXPECT_EQ(estimate_zero_memory(psi, 4, 2).model_states(), 4 * psi + 12 * psi / 4);
  // Only stage 1 reads the accumulation.
  for (int stage : {0, 2, 3})
    EXPECT_EQ(estimate_zero_memory(psi, 4, stage, false, 1, 0, 0, false, 4).model_states(),
              estimate_zero_memory(psi, 4, stage).model_states());
  EXPECT_THROW(estimate_zero_memory(psi, 4, 1, false, 1, 0, 0, false, 0), deepspeed::ConfigError);
  EXPECT_EQ(estimate_zero_memory(psi, 4, 3).model_states(), 16 * psi / 4);
}

TEST(EstimateZeroMemory, MixedPrecisionFormulas) {
  const int64_t psi = 1000000;
  EXPECT_EQ(estimate_zero_memory(psi, 8, 0, true).model_states(), 16 * psi);
  EXPECT_EQ(estimate_zero_memory(psi, 8, 1, true).model_states(), 2 * psi + 14 * psi / 8);
  EXPECT_EQ(estimate_zero_memory(psi, 8, 1, true, 1, 0, 0, false, 3).model_states(),
            4 * psi + 14 * psi / 8);
  EXPECT_EQ(estimate_zero_memory(psi, 8, 2, true).model_states(), 2 * psi + 14 * psi / 8);
  EXPECT_EQ(estimate_zero_memory(psi, 8, 3, true).model_states(), 16 * psi / 8);
}

TEST(EstimateZeroMemory, TableListsEveryStageAndBadInputThrows) {
  auto table = deepspeed::format_zero_memory_estimates(3300000, 2);
  for (const char* row : {"    0 |", "    1 |", "    2 |", "    3 |"})
    EXPECT_NE(table.find(row), std::string::npos) << table;
  EXPECT_THROW(estimate_zero_memory(10, 0, 1), deepspeed::ConfigError);
  EXPECT_THROW(estimate_zero_memory(10, 2, 4), deepspeed::ConfigError);
}

// Gradients accumulated in fp32 in mixed precision (bf16 at stage 0 with accumulation, or
// data_types.grad_accum_dtype fp32): 4Ψ of gradients (4Ψ/N from stage 2, and at stage 1 without
// accumulation) and no widened copy in
// the step. Stage 0: 2 + 4 + 12 = 18Ψ.
TEST(EstimateZeroMemory, Fp32AccumulationWidensTheGradientsAndNeedsNoStepCopy) {
  const int64_t psi = 1000000;
  auto e = estimate_zero_memory(psi, 8, 0, true, 1, 0, 4);
  EXPECT_EQ(e.gradients, 4 * psi);
  EXPECT_EQ(e.model_states(), 18 * psi);
  EXPECT_EQ(e.step_transient, 0);
  EXPECT_EQ(e.peak(), 18 * psi);
  // Stage 1: with one micro-step an fp32 partition (4Ψ/N); accumulating, the all-reduced fp32
  // buffer of every gradient (4Ψ: DeepSpeed's BF16_Optimizer at stage 1).
  EXPECT_EQ(estimate_zero_memory(psi, 8, 1, true, 1, 0, 4).model_states(), 2 * psi + 16 * psi / 8);
  EXPECT_EQ(estimate_zero_memory(psi, 8, 1, true, 1, 0, 4, false, 2).model_states(),
            6 * psi + 12 * psi / 8);
  EXPECT_EQ(estimate_zero_memory(psi, 8, 2, true, 1, 0, 4).gradients, 4 * psi / 8);
  EXPECT_EQ(estimate_zero_memory(psi, 8, 3, true, 1, 0, 4).peak(), 18 * psi / 8);
  // The weights' width, said or not, is the default.
  EXPECT_EQ(estimate_zero_memory(psi, 8, 2, true, 1, 0, 2).peak(),
            estimate_zero_memory(psi, 8, 2, true).peak());
  EXPECT_EQ(estimate_zero_memory(psi, 8, 0, false, 1, 0, 4).model_states(), 16 * psi);
  EXPECT_EQ(dstest::message_of<deepspeed::ConfigError>(
                [&] { estimate_zero_memory(psi, 8, 0, false, 1, 0, 2); }),
            "estimate_zero_memory: grad_accum_bytes 2 is narrower than the 4-byte weights "
            "(initialize() refuses such a data_types.grad_accum_dtype)");
  EXPECT_EQ(dstest::message_of<deepspeed::ConfigError>(
                [&] { estimate_zero_memory(psi, 8, 0, true, 1, 0, 3); }),
            "estimate_zero_memory: grad_accum_bytes 3 must be 0 (the weights' width), 2 or 4");
  EXPECT_CONTAINS(deepspeed::format_zero_memory_estimates(psi, 8, true, 1, 0, 4),
                  "mixed precision with fp32 gradient accumulation");
}

// hpZ (ZeRO++): the secondary partition, 1/hpz of the weights in their dtype, at stage 3 only;
// the primary partitions are unchanged. 64 ranks in groups of 8 (one node each): 2Ψ/8 more in
// 16 bits, as the ZeRO++ paper counts it.
TEST(EstimateZeroMemory, HpzAddsTheSecondaryPartitionAtStage3) {
  const int64_t psi = 1000000;
  auto plain = estimate_zero_memory(psi, 64, 3, true);
  auto hpz = estimate_zero_memory(psi, 64, 3, true, 8);
  EXPECT_EQ(plain.hpz_secondary, 0);
  EXPECT_EQ(hpz.model_states(), plain.model_states());
  EXPECT_EQ(hpz.hpz_secondary, 2 * psi / 8);
  EXPECT_EQ(hpz.peak(), 16 * psi / 64 + 2 * psi / 8);
  EXPECT_EQ(estimate_zero_memory(psi, 4, 3, false, 2).hpz_secondary, 4 * psi / 2);  // fp32
  EXPECT_EQ(estimate_zero_memory(psi, 4, 3, true, 1).hpz_secondary, 0);   // hpz 1: none
  EXPECT_EQ(estimate_zero_memory(psi, 4, 2, true, 2).hpz_secondary, 0);   // stage 3 only
  EXPECT_EQ(estimate_zero_memory(psi, 4, 3, true, 16).hpz_secondary, 2 * psi / 4);  // = world
  EXPECT_THROW(estimate_zero_memory(psi, 6, 3, true, 4), deepspeed::ConfigError);
  EXPECT_THROW(estimate_zero_memory(psi, 4, 3, true, 0), deepspeed::ConfigError);
  try {
    estimate_zero_memory(psi, 6, 3, true, 4);
  } catch (const deepspeed::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("zero_hpz_partition_size 4"), std::string::npos) << e.what();
  }
  auto table = deepspeed::format_zero_memory_estimates(psi, 64, true, 8);
  EXPECT_NE(table.find("hpZ secondary"), std::string::npos) << table;
  EXPECT_NE(table.find("hpZ groups of 8"), std::string::npos) << table;
}

// Mixed precision with a step that widens the gradient partition to fp32 (fp16 on the CPU, the
// other optimizers): 4Ψ/N (stage 0's one partition is all Ψ), which peak() counts and
// model_states() does not. With it stage 2's peak is DeepSpeed's
// estimate_zero2_model_states_mem_needs, 2Ψ + 18Ψ/N. Adam/AdamW (the default) reads the 16-bit
// gradients as they are; fp32 gradients are stepped on themselves either way.
TEST(EstimateZeroMemory, PeakCountsAWideningStepsFp32GradientCopy) {
  const int64_t psi = 1000000;
  for (int stage : {1, 2, 3}) {
    auto e = estimate_zero_memory(psi, 8, stage, true, 1, 0, 0, /*widening_step=*/true);
    EXPECT_EQ(e.step_transient, 4 * psi / 8) << "stage " << stage;
    EXPECT_EQ(e.peak(), e.model_states() + 4 * psi / 8) << "stage " << stage;
    auto adam = estimate_zero_memory(psi, 8, stage, true);
    EXPECT_EQ(adam.step_transient, 0) << "stage " << stage;
    EXPECT_EQ(adam.peak(), adam.model_states()) << "stage " << stage;
  }
  EXPECT_EQ(estimate_zero_memory(psi, 8, 0, true, 1, 0, 0, true).step_transient, 4 * psi);
  EXPECT_EQ(estimate_zero_memory(psi, 8, 2, true, 1, 0, 0, true).peak(), 2 * psi + 18 * psi / 8);
  EXPECT_EQ(estimate_zero_memory(psi, 8, 2, true).peak(), 2 * psi + 14 * psi / 8);
  for (int stage = 0; stage < 4; ++stage) {
    EXPECT_EQ(estimate_zero_memory(psi, 8, stage, false, 1, 0, 0, true).step_transient, 0)
        << "stage " << stage;
    EXPECT_EQ(estimate_zero_memory(psi, 8, stage, true, 1, 0, 4, true).step_transient, 0)
        << "stage " << stage << ", fp32 accumulation";
  }
}

// Stage 3's largest layer gathered whole with its gradient: DeepSpeed's 4·largest_layer_params
// in 16 bits (8· in fp32); other stages hold every layer anyway. Stage 3's mixed-precision peak:
// 4L + 16Ψ/N with Adam, 4L + 20Ψ/N with a widening step (DeepSpeed's estimate_zero3 says
// 4L + 18Ψ/N: memory.h).
TEST(EstimateZeroMemory, Stage3PeakCountsTheLargestLayer) {
  const int64_t psi = 1000000, largest = 50000;
  auto e = estimate_zero_memory(psi, 8, 3, true, 1, largest);
  EXPECT_EQ(e.largest_layer_working, 4 * largest);
  EXPECT_EQ(e.peak(), 4 * largest + 16 * psi / 8);
  EXPECT_EQ(estimate_zero_memory(psi, 8, 3, true, 1, largest, 0, true).peak(),
            4 * largest + 20 * psi / 8);
  EXPECT_EQ(estimate_zero_memory(psi, 8, 3, false, 1, largest).largest_layer_working, 8 * largest);
  EXPECT_EQ(estimate_zero_memory(psi, 8, 2, true, 1, largest).largest_layer_working, 0);
  EXPECT_EQ(estimate_zero_memory(psi, 8, 3, true).largest_layer_working, 0);
  EXPECT_EQ(dstest::message_of<deepspeed::ConfigError>(
                [&] { estimate_zero_memory(psi, 8, 3, true, 1, psi + 1); }),
            "estimate_zero_memory: largest_layer_params 1000001 must be in 0..1000000 (the "
            "parameter count)");
  auto table = deepspeed::format_zero_memory_estimates(psi, 8, true, 1, largest);
  EXPECT_CONTAINS(table, "largest layer 50000");
}

// The table's MB is 2^20 bytes, as see_memory_usage's "model states (MB)". 2^20 fp32 parameters
// on one rank at stage 0: 4 MB of weights, 16 MB of model states (1e6-byte MB would print 4.2).
TEST(EstimateZeroMemory, TableMegabytesAreMebibytes) {
  auto table = deepspeed::format_zero_memory_estimates(int64_t{1} << 20, 1);
  EXPECT_CONTAINS(table, "MB = 2^20 bytes");
  EXPECT_CONTAINS(table, "      0 |             4.0 |            4.0 |            8.0 |"
                         "              16.0 |      16.0\n");
  auto mixed = deepspeed::format_zero_memory_estimates(int64_t{1} << 20, 1, true);
  // Mixed precision stage 0: 2 + 2 + 12 MB of model states, the peak (Adam reads the bf16
  // gradients: no fp32 copy of them).
  EXPECT_CONTAINS(mixed, "      0 |             2.0 |            2.0 |           12.0 |"
                         "              16.0 |      16.0\n");
}

// DeepSpeed's estimate_zero2/3_model_states_mem_needs, every branch, against its formulas
// evaluated by DeepSpeed's Python (stage_1_and_2.py, stage3.py), truncation to whole bytes
// included: {cpu, gpu} bytes.
struct DsCase {
  int64_t total, largest;
  int gpus_per_node, nodes;
  bool offload, offload_params, zero_init;
  double factor;
  int64_t cpu, gpu;
};

TEST(DeepSpeedEstimators, Zero2MatchesDeepSpeedsFormulas) {
  const DsCase cases[] = {
      // offload: GPU 2Ψ; CPU Ψ·max(4N, 16)·f. N = 8: 4N = 32.
      {3000000000, 0, 8, 1, true, false, false, 1.5, 144000000000, 6000000000},
      // N = 2: the floor of 16 bytes per parameter.
      {1300000001, 0, 2, 1, true, false, false, 1.5, 31200000024, 2600000002},
      // no offload: GPU 2Ψ + int(18Ψ/N); CPU 4Ψ·G·f (G per node, not N).
      {3000000000, 0, 8, 1, false, false, false, 1.5, 144000000000, 12750000000},
      {1300000001, 0, 4, 3, false, false, false, 1.2, 24960000019, 4550000003},
      {7000000007, 0, 3, 1, false, false, false, 1.0, 84000000084, 56000000056},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::to_string(c.total) + " params, " + std::to_string(c.gpus_per_node) + "x" +
                 std::to_string(c.nodes) + (c.offload ? ", offload" : ""));
    auto m = deepspeed::estimate_zero2_model_states_mem_needs(c.total, c.gpus_per_node, c.nodes,
                                                              c.offload, c.factor);
    EXPECT_EQ(m.cpu_bytes, c.cpu);
    EXPECT_EQ(m.gpu_bytes, c.gpu);
    EXPECT_EQ(m.largest_layer_bytes, 0);
  }
  // DeepSpeed's defaults: 1 GPU, 1 node, cpu_offload, f = 1.5.
  EXPECT_EQ(deepspeed::estimate_zero2_model_states_mem_needs(1000).cpu_bytes, 24000);
  // Without offload it is estimate_zero_memory's mixed-precision stage-2 peak with a widening
  // step, 2Ψ + 18Ψ/N (DeepSpeed's stage 2 widens; Adam here does not, 4Ψ/N less).
  EXPECT_EQ(deepspeed::estimate_zero2_model_states_mem_needs(8000000, 8, 1, false).gpu_bytes,
            estimate_zero_memory(8000000, 8, 2, true, 1, 0, 0, /*widening_step=*/true).peak());
}

TEST(DeepSpeedEstimators, Zero3MatchesDeepSpeedsFormulasInEveryBranch) {
  const int64_t big = 13000000000, layer = 325000000;  // DeepSpeed's docs' 13B example
  const DsCase cases[] = {
      // offload_optimizer + offload_param: GPU 4L; CPU Ψ·18/nodes·f, or ·max(4G, 18/nodes).
      {big, layer, 8, 1, true, true, true, 1.5, 351000000000, 1300000000},
      {big, layer, 8, 1, true, true, false, 1.5, 624000000000, 1300000000},
      // offload_optimizer only: GPU 4L + int(2Ψ/N); CPU Ψ·16/nodes·f, or ·max(4G, 16/nodes).
      {big, layer, 8, 1, true, false, true, 1.5, 312000000000, 4550000000},
      {big, layer, 8, 1, true, false, false, 1.5, 624000000000, 4550000000},
      // no offload: GPU 4L + int(18Ψ/N); CPU 4L·G·f with zero_init, 4Ψ·G·f without.
      {big, layer, 8, 1, false, false, true, 1.5, 15600000000, 30550000000},
      {big, layer, 8, 1, false, false, false, 1.5, 624000000000, 30550000000},
      // 3 nodes of 2 GPUs, odd counts: 18/nodes is a float, the results truncated.
      {1000000007, 50000001, 2, 3, true, true, true, 1.5, 9000000063, 200000004},
      {1000000007, 50000001, 2, 3, true, true, false, 1.5, 12000000084, 200000004},
      {1000000007, 50000001, 2, 3, true, false, true, 1.5, 8000000055, 533333339},
      {1000000007, 50000001, 2, 3, true, false, false, 1.5, 12000000084, 533333339},
      {1000000007, 50000001, 2, 3, false, false, true, 1.3, 520000010, 3200000025},
      // cpu_offload_params without cpu_offload: ignored, as DeepSpeed's branches do.
      {1000000007, 50000001, 2, 3, false, true, true, 1.5, 600000012, 3200000025},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::to_string(c.total) + " params, " + std::to_string(c.gpus_per_node) + "x" +
                 std::to_string(c.nodes) + ", offload " + std::to_string(c.offload) +
                 ", offload_params " + std::to_string(c.offload_params) + ", zero_init " +
                 std::to_string(c.zero_init));
    auto m = deepspeed::estimate_zero3_model_states_mem_needs(c.total, c.largest, c.gpus_per_node,
                                                              c.nodes, c.offload, c.offload_params,
                                                              c.zero_init, c.factor);
    EXPECT_EQ(m.cpu_bytes, c.cpu);
    EXPECT_EQ(m.gpu_bytes, c.gpu);
    EXPECT_EQ(m.largest_layer_bytes, 4 * c.largest);
  }
  // Without offload: estimate_zero_memory's stage-3 peak with a widening step less the 16-bit
  // gradient partition (2Ψ/N) DeepSpeed leaves out (memory.h).
  const int64_t psi = 8000000, largest = 100000;
  EXPECT_EQ(deepspeed::estimate_zero3_model_states_mem_needs(psi, largest, 8, 1, false, false)
                .gpu_bytes,
            estimate_zero_memory(psi, 8, 3, true, 1, largest, 0, true).peak() - 2 * psi / 8);
}

TEST(DeepSpeedEstimators, AllColdTablesAreDeepSpeedsLines) {
  EXPECT_EQ(deepspeed::estimate_zero2_model_states_mem_needs_all_cold(3000000000, 8),
            "Estimated memory needed for params, optim states and gradients for a:\n"
            "HW: Setup with 1 node, 8 GPUs per node.\n"
            "SW: Model with 3000M total params.\n"
            "  per CPU  |  per GPU |   Options\n"
            "  134.11GB |   5.59GB | offload_optimizer=cpu \n"
            "  134.11GB |  11.87GB | offload_optimizer=none\n");
  EXPECT_EQ(deepspeed::estimate_zero3_model_states_mem_needs_all_cold(13000000000, 325000000, 8),
            "Estimated memory needed for params, optim states and gradients for a:\n"
            "HW: Setup with 1 node, 8 GPUs per node.\n"
            "SW: Model with 13000M total params, 325M largest layer params.\n"
            "  per CPU  |  per GPU |   Options\n"
            "  326.89GB |   1.21GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1\n"
            "  581.15GB |   1.21GB | offload_param=cpu , offload_optimizer=cpu , zero_init=0\n"
            "  290.57GB |   4.24GB | offload_param=none, offload_optimizer=cpu , zero_init=1\n"
            "  581.15GB |   4.24GB | offload_param=none, offload_optimizer=cpu , zero_init=0\n"
            "   14.53GB |  28.45GB | offload_param=none, offload_optimizer=none, zero_init=1\n"
            "  581.15GB |  28.45GB | offload_param=none, offload_optimizer=none, zero_init=0\n");
  EXPECT_CONTAINS(deepspeed::estimate_zero2_model_states_mem_needs_all_cold(1000000, 1, 2),
                  "HW: Setup with 2 nodes, 1 GPU per node.");
}

TEST(DeepSpeedEstimators, BadSetupsNameTheArgument) {
  using deepspeed::ConfigError;
  EXPECT_EQ(dstest::message_of<ConfigError>(
                [] { deepspeed::estimate_zero2_model_states_mem_needs(100, 0); }),
            "estimate_zero2_model_states_mem_needs: num_gpus_per_node 0 must be >= 1");
  EXPECT_EQ(dstest::message_of<ConfigError>(
                [] { deepspeed::estimate_zero2_model_states_mem_needs(100, 1, 0); }),
            "estimate_zero2_model_states_mem_needs: num_nodes 0 must be >= 1");
  EXPECT_EQ(dstest::message_of<ConfigError>(
                [] { deepspeed::estimate_zero2_model_states_mem_needs(-1); }),
            "estimate_zero2_model_states_mem_needs: total_params -1 must be >= 0");
  EXPECT_EQ(dstest::message_of<ConfigError>(
                [] { deepspeed::estimate_zero3_model_states_mem_needs(100, 101); }),
            "estimate_zero3_model_states_mem_needs: largest_layer_params 101 must be in 0..100 "
            "(total_params)");
  EXPECT_CONTAINS(dstest::message_of<ConfigError>([] {
                    deepspeed::estimate_zero3_model_states_mem_needs(100, 1, 1, 1, true, true,
                                                                     true, -1.0);
                  }),
                  "additional_buffer_factor -1.000000 must be finite and >= 0");
}

// What the step really allocates: one bf16 rank (N = 1) measured with the CPU allocation meter
// around step() after a first step made the moments. Adam reads the bf16 gradient partition as it
// is and the norm reads it in one pass (zero/tensor_facts.cpp), so the step allocates no copy of
// the gradients (a widened one was 4Ψ, 6.9 MB here, before 2026-12-01): the model states alone
// are the peak, as the estimate says (step_transient 0). Stage 0 with
// gradient_accumulation_steps 2 accumulates in fp32 (bf16's default there): 4Ψ of gradients
// held, which the step updates from in place.
TEST(EstimateZeroMemory, PeakCoversWhatTheMixedPrecisionStepAllocates) {
  struct Case {
    int stage, accumulation;
  };
  for (const Case c : {Case{1, 1}, Case{2, 1}, Case{0, 2}}) {
    SCOPED_TRACE("stage " + std::to_string(c.stage) + ", gradient_accumulation_steps " +
                 std::to_string(c.accumulation));
    auto config = dstest::base_config(2, c.accumulation, c.stage);
    config["bf16"] = {{"enabled", true}};
    config["gradient_clipping"] = 0.0;
    config["steps_per_print"] = 0;
    const gpt::GPTConfig model{256, 16, 2, 2, 256};
    auto e = dstest::make_single_engine(config, model);
    e.train(1);
    for (int micro = 1; micro < c.accumulation; ++micro) {  // to the boundary's backward
      auto batch = e.loader->next();
      e.engine->backward(e.engine->forward(batch.data, batch.target));
      e.engine->step();
    }
    auto batch = e.loader->next();
    e.engine->backward(e.engine->forward(batch.data, batch.target));
    ASSERT_TRUE(e.engine->is_gradient_accumulation_boundary());
    const auto held = e.engine->memory_report();
    int64_t step_bytes = 0;
    {
      deepspeed::util::AllocationMeter meter;
      e.engine->step();
      step_bytes = meter.peak_bytes();
    }
    const int64_t psi = dstest::count_parameters(model);
    // The gradients' width as initialize() resolves it (memory.h): bf16 accumulates in fp32 at
    // stage 0, kept so with more than one micro-step.
    const int grad_bytes = c.stage == 0 && c.accumulation > 1 ? 4 : 0;
    const auto est = estimate_zero_memory(psi, 1, c.stage, true, 1, 0, grad_bytes);
    EXPECT_EQ(est.step_transient, 0);
    EXPECT_LT(step_bytes, psi / 8) << "the step allocated a copy of the gradients";
    EXPECT_LE(held.model_states() + step_bytes, est.peak() * 105 / 100)
        << "held " << held.model_states() << ", step " << step_bytes << ", estimated peak "
        << est.peak();
    EXPECT_NEAR(held.model_states(), est.model_states(), 0.05 * est.model_states());
  }
}

// The placement options (memory.h's ZeroMemoryOptions): what initialize() keeps where, by hand.
deepspeed::ZeroMemoryOptions options(int n, int stage, bool mixed = true) {
  deepspeed::ZeroMemoryOptions o;
  o.world_size = n;
  o.stage = stage;
  o.mixed_precision = mixed;
  return o;
}

// DeepSpeed's low-precision masters: the 16-bit partition is the master where it sits beside the
// update (the CPU; a GPU without offload): 8 bytes an element (fp32 moments) or 4 (bf16 moments)
// against 12. ZeRO-Offload on a GPU keeps a 16-bit host copy: 10 or 6.
TEST(EstimateZeroMemory, LowPrecisionMastersCountTheirBytes) {
  const int64_t psi = 1000000;
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    auto o = options(4, stage);
    o.low_precision_masters = true;
    o.offload_optimizer = "cpu";
    auto e = estimate_zero_memory(psi, o);
    EXPECT_EQ(e.optimizer_states, 8 * psi / 4);
    EXPECT_EQ(e.host_bytes, e.model_states());  // the CPU: all of it in host memory
    o.bf16_moments = true;
    EXPECT_EQ(estimate_zero_memory(psi, o).optimizer_states, 4 * psi / 4);
    o.gpu = true;
    e = estimate_zero_memory(psi, o);
    EXPECT_EQ(e.optimizer_states, 6 * psi / 4);
    // ZeRO-Offload: the optimizer and the gradient partition in host memory (stage 1 reduces
    // into one as well without gradient accumulation).
    EXPECT_EQ(e.host_bytes, 6 * psi / 4 + 2 * psi / 4);
    o.bf16_moments = false;
    EXPECT_EQ(estimate_zero_memory(psi, o).optimizer_states, 10 * psi / 4);
    o.offload_optimizer = "none";
    o.bf16_moments = true;
    e = estimate_zero_memory(psi, o);
    EXPECT_EQ(e.optimizer_states, 4 * psi / 4);
    EXPECT_EQ(e.host_bytes, 0);
  }
}

TEST(EstimateZeroMemory, LowPrecisionRulesAreInitializes) {
  auto o = options(4, 0);
  o.low_precision_masters = true;
  o.offload_optimizer = "cpu";
  EXPECT_CONTAINS(dstest::message_of<deepspeed::ConfigError>([&] { estimate_zero_memory(10, o); }),
                  "stage 1-3");
  o = options(4, 2, /*mixed=*/false);
  o.low_precision_masters = true;
  o.offload_optimizer = "cpu";
  EXPECT_CONTAINS(dstest::message_of<deepspeed::ConfigError>([&] { estimate_zero_memory(10, o); }),
                  "16-bit model");
  o = options(4, 2);
  o.bf16_moments = true;
  EXPECT_CONTAINS(dstest::message_of<deepspeed::ConfigError>([&] { estimate_zero_memory(10, o); }),
                  "bf16.bf16_optimizer_states needs bf16.bf16_master_weights_and_grads");
  o = options(4, 2);
  o.low_precision_masters = true;
  EXPECT_CONTAINS(dstest::message_of<deepspeed::ConfigError>([&] { estimate_zero_memory(10, o); }),
                  "zero_optimization.offload_optimizer.device \"cpu\"");
  o = options(4, 2);
  o.offload_optimizer = "disk";
  EXPECT_EQ(dstest::message_of<deepspeed::ConfigError>([&] { estimate_zero_memory(10, o); }),
            "estimate_zero_memory: zero_optimization.offload_optimizer.device \"disk\" must be "
            "\"none\", \"cpu\" or \"nvme\"");
}

// On a GPU what offload moves is in host memory and the rest in the GPU's; on the CPU all of it
// is host memory. Offload below its stage is ignored, as initialize() ignores it.
TEST(EstimateZeroMemory, OffloadSplitsHostAndDeviceOnAGpu) {
  const int64_t psi = 1000000, largest = 50000;
  auto o = options(4, 2);
  o.gpu = true;
  auto e = estimate_zero_memory(psi, o);
  EXPECT_EQ(e.host_bytes, 0);
  EXPECT_EQ(e.peak_device(), e.peak());
  o.offload_optimizer = "cpu";
  e = estimate_zero_memory(psi, o);
  EXPECT_EQ(e.model_states(), 2 * psi + 14 * psi / 4);  // the same bytes, elsewhere
  EXPECT_EQ(e.host_bytes, 14 * psi / 4);                // gradient partition + masters + moments
  EXPECT_EQ(e.peak_device(), 2 * psi);                  // DeepSpeed's "GPU 2Ψ" of cpu_offload
  o.offload_param = "cpu";                              // stage 2: ignored
  EXPECT_EQ(estimate_zero_memory(psi, o).host_bytes, 14 * psi / 4);
  // ZeRO-3 with parameters and optimizer on the CPU: the GPU holds the gathered layer only.
  o.stage = 3;
  o.largest_layer_params = largest;
  e = estimate_zero_memory(psi, o);
  EXPECT_EQ(e.host_bytes, e.model_states());
  EXPECT_EQ(e.peak_device(), 4 * largest);
  // offload_param alone: the fp32 masters and the step stay on the GPU (a copy; DeepSpeed's too).
  o.offload_optimizer = "none";
  e = estimate_zero_memory(psi, o);
  EXPECT_EQ(e.host_bytes, 2 * psi / 4);
  EXPECT_EQ(e.peak_device(), 4 * largest + 2 * psi / 4 + 12 * psi / 4);
  // 16-bit masters: ZeRO-Offload's host copy is made of a partition on the GPU only; stage 3's
  // offloaded partition is already in host memory, beside the CPU update, and is the master.
  auto lowp = options(4, 3);
  lowp.gpu = true;
  lowp.low_precision_masters = true;
  lowp.offload_optimizer = "cpu";
  EXPECT_EQ(estimate_zero_memory(psi, lowp).optimizer_states, (2 + 8) * psi / 4);
  lowp.offload_param = "cpu";
  EXPECT_EQ(estimate_zero_memory(psi, lowp).optimizer_states, 8 * psi / 4);
  // Stage 1 under ZeRO-Offload: its gradient partition in host memory; accumulating wider than
  // the weights it all-reduces a full buffer on the GPU instead.
  auto one = options(4, 1);
  one.gpu = true;
  one.offload_optimizer = "cpu";
  EXPECT_EQ(estimate_zero_memory(psi, one).host_bytes, (12 + 2) * psi / 4);
  one.accumulation_steps = 2;
  one.grad_accum_bytes = 4;
  e = estimate_zero_memory(psi, one);
  // ... and the CPU Adam brings its partition's fp32 slice down into a host landing buffer.
  EXPECT_EQ(e.optimizer_states, (12 + 4) * psi / 4);
  EXPECT_EQ(e.host_bytes, (12 + 4) * psi / 4);
  EXPECT_EQ(e.peak_device(), 2 * psi + 4 * psi);
  // An fp32 model: the master is the partition unless it is elsewhere than the update.
  auto fp32 = options(4, 3, /*mixed=*/false);
  EXPECT_EQ(estimate_zero_memory(psi, fp32).optimizer_states, 8 * psi / 4);
  fp32.gpu = true;
  fp32.offload_param = "cpu";
  EXPECT_EQ(estimate_zero_memory(psi, fp32).optimizer_states, 12 * psi / 4);
  // With the optimizer offloaded too the host partition is beside the CPU update: the master.
  fp32.offload_optimizer = "cpu";
  EXPECT_EQ(estimate_zero_memory(psi, fp32).optimizer_states, 8 * psi / 4);
  fp32.gpu = false;  // the CPU: the partition is beside the update
  EXPECT_EQ(estimate_zero_memory(psi, fp32).optimizer_states, 8 * psi / 4);
  // The CPU: everything, transients included, is host memory.
  auto cpu = options(4, 3);
  cpu.offload_optimizer = cpu.offload_param = "cpu";
  cpu.largest_layer_params = largest;
  e = estimate_zero_memory(psi, cpu);
  EXPECT_EQ(e.peak_host(), e.peak());
  EXPECT_EQ(e.peak_device(), 0);
  // An optimizer other than Adam under ZeRO-Offload on a GPU (widening_step): no CPU Adam reads
  // the gradients as they arrive, so their partition stays on the GPU and the step copies it into
  // an fp32 host buffer kept for the run (shard_optimizer.cpp's offloaded_step), 4 bytes an
  // element beside the master and the moments: persistent, not a transient.
  o = options(4, 2);
  o.gpu = true;
  o.widening_step = true;
  o.optimizer_moments = 1;  // Lion
  o.offload_optimizer = "cpu";
  e = estimate_zero_memory(psi, o);
  EXPECT_EQ(e.optimizer_states, (4 + 4 + 4) * psi / 4);
  EXPECT_EQ(e.host_bytes, e.optimizer_states);  // the 16-bit gradient partition is on the GPU
  EXPECT_EQ(e.step_transient, 0);
  EXPECT_EQ(e.host_transient, 0);
  EXPECT_EQ(e.peak_device(), 2 * psi + 2 * psi / 4);
  // Without offload the step widens a transient copy on the GPU.
  o.offload_optimizer = "none";
  e = estimate_zero_memory(psi, o);
  EXPECT_EQ(e.step_transient, 4 * psi / 4);
  EXPECT_EQ(e.host_transient, 0);
  // Stage 3 with its partition offloaded: the gradients are in host memory already, and the
  // widened copy is the step's, on the host.
  o = options(4, 3);
  o.gpu = true;
  o.widening_step = true;
  o.offload_optimizer = o.offload_param = "cpu";
  e = estimate_zero_memory(psi, o);
  EXPECT_EQ(e.optimizer_states, 12 * psi / 4);
  EXPECT_EQ(e.host_transient, 4 * psi / 4);
}

// The optimizer's own state (optimizer_moments): Adam's two fp32 moments, one for Lion, Adagrad
// and SGD with momentum, none for plain SGD; beside an fp32 master copy of a 16-bit model, or
// the fp32 partition itself.
TEST(EstimateZeroMemory, OptimizerStateFollowsTheOptimizersMoments) {
  const int64_t psi = 1000000;
  for (int moments : {0, 1, 2}) {
    SCOPED_TRACE("moments " + std::to_string(moments));
    auto o = options(4, 2);
    o.optimizer_moments = moments;
    EXPECT_EQ(estimate_zero_memory(psi, o).optimizer_states, (4 + 4 * moments) * psi / 4);
    o.mixed_precision = false;
    EXPECT_EQ(estimate_zero_memory(psi, o).optimizer_states, 4 * moments * psi / 4);
    o = options(4, 0);
    o.optimizer_moments = moments;
    EXPECT_EQ(estimate_zero_memory(psi, o).optimizer_states, (4 + 4 * moments) * psi);
  }
  // What needs the CPU Adam needs two moments; and no optimizer has more.
  auto o = options(4, 2);
  o.optimizer_moments = 3;
  EXPECT_CONTAINS(dstest::message_of<deepspeed::ConfigError>([&] { estimate_zero_memory(10, o); }),
                  "optimizer_moments 3 must be 0, 1 or 2");
  o = options(4, 2);
  o.optimizer_moments = 1;
  o.offload_optimizer = "nvme";
  EXPECT_CONTAINS(dstest::message_of<deepspeed::ConfigError>([&] { estimate_zero_memory(10, o); }),
                  "\"nvme\" needs the Adam or AdamW optimizer");
  o.offload_optimizer = "cpu";
  o.low_precision_masters = true;
  EXPECT_CONTAINS(dstest::message_of<deepspeed::ConfigError>([&] { estimate_zero_memory(10, o); }),
                  "low-precision masters need the Adam or AdamW optimizer");
  o = options(4, 0);  // stage 0 ignores the offload, as initialize() does
  o.optimizer_moments = 1;
  o.offload_optimizer = "nvme";
  EXPECT_NO_THROW(estimate_zero_memory(10, o));
  // The table names what it counted.
  o = options(4, 2);
  EXPECT_CONTAINS(deepspeed::format_zero_memory_estimates(psi, o), "mixed precision, Adam\n");
  o.widening_step = true;
  o.optimizer_moments = 1;
  EXPECT_CONTAINS(deepspeed::format_zero_memory_estimates(psi, o),
                  "mixed precision, an optimizer with 1 moment an element\n");
  o.optimizer_moments = 0;
  EXPECT_CONTAINS(deepspeed::format_zero_memory_estimates(psi, o),
                  "mixed precision, an optimizer without moments\n");
}

// The 1-bit optimizers' state beside Adam's moments (optim/compressed_allreduce.h): the worker
// error of the model padded to 8N elements and the server error of this rank's 1/N of it, fp32;
// 0/1 Adam's local updates and synchronised parameters, 1-bit Lamb's fresh variance.
TEST(EstimateZeroMemory, OneBitOptimizersCountTheirStateBesideTheMoments) {
  const int64_t psi = 1000001;
  const int64_t padded = 1000032;  // a multiple of 8 * 4
  const int64_t errors = 4 * (padded + padded / 4);
  auto o = options(4, 0);
  o.widening_step = true;
  const int64_t adam = estimate_zero_memory(psi, o).optimizer_states;
  EXPECT_EQ(adam, 12 * psi);  // fp32 master and two moments, replicated at stage 0
  o.onebit_optimizer = "OneBitAdam";
  EXPECT_EQ(estimate_zero_memory(psi, o).optimizer_states, adam + errors);
  o.onebit_optimizer = "ZeroOneAdam";
  EXPECT_EQ(estimate_zero_memory(psi, o).optimizer_states, adam + errors + 8 * psi);
  o.onebit_optimizer = "OneBitLamb";
  EXPECT_EQ(estimate_zero_memory(psi, o).optimizer_states, adam + errors + 4 * psi);
  EXPECT_EQ(estimate_zero_memory(psi, o).host_bytes, estimate_zero_memory(psi, o).model_states());
  o.gpu = true;  // stage 0 on a GPU: all of it in the GPU's memory
  EXPECT_EQ(estimate_zero_memory(psi, o).host_bytes, 0);
  // One rank: no padding beyond 8, the server error as large as the worker's.
  auto one = options(1, 0, /*mixed=*/false);
  one.onebit_optimizer = "OneBitAdam";
  EXPECT_EQ(estimate_zero_memory(16, one).optimizer_states, 8 * 16 + 4 * (16 + 16));
  // The table has the stage-0 row alone and names the optimizer.
  const std::string table = deepspeed::format_zero_memory_estimates(psi, o);
  EXPECT_CONTAINS(table, "OneBitLamb (its error feedback included; stage 0 only)");
  EXPECT_CONTAINS(table, "      0 | ");
  EXPECT_EQ(table.find("      1 | "), std::string::npos) << table;
  // What initialize() refuses is refused by name.
  o.stage = 1;
  EXPECT_CONTAINS(dstest::message_of<deepspeed::ConfigError>([&] { estimate_zero_memory(10, o); }),
                  "zero_optimization.stage = 1 with optimizer.type \"OneBitLamb\"");
  o.stage = 0;
  o.onebit_optimizer = "OneBitSgd";
  EXPECT_CONTAINS(dstest::message_of<deepspeed::ConfigError>([&] { estimate_zero_memory(10, o); }),
                  "onebit_optimizer \"OneBitSgd\" is none of");
  o.onebit_optimizer = "OneBitAdam";
  o.optimizer_moments = 1;
  EXPECT_CONTAINS(dstest::message_of<deepspeed::ConfigError>([&] { estimate_zero_memory(10, o); }),
                  "OneBitAdam keeps Adam's two moments");
}

// The NVMe swap by hand (offload/swapped_adam.cpp): 1000001 elements a rank in sub-groups of
// 300000 (three, and one of 100001); each a region [master | exp_avg | exp_avg_sq], arrays on 64
// bytes, the region on 4096.
TEST(EstimateZeroMemory, NvmeCountsTheFilesAndTheRingInMemory) {
  const int64_t psi = 2000002;  // 1000001 a rank
  auto o = options(2, 2);
  o.offload_optimizer = "nvme";
  o.sub_group_size = 300000;
  o.optimizer_buffer_count = 2;
  // fp32: 300000 x (4 + 4 + 4) = 3600000 -> 3600384; 100001 x 4 = 400004 -> 400064 each,
  // 1200192 -> 1204224.
  auto e = estimate_zero_memory(psi, o);
  EXPECT_EQ(e.nvme_bytes, 3 * 3600384 + 1204224);
  EXPECT_EQ(e.optimizer_states, 2 * 3600384);  // the ring: two of the four sub-groups
  EXPECT_EQ(e.host_bytes, e.model_states());
  // bf16 master and moments: 300000 x 2 x 3 = 1800000 -> 1802240; 200002 -> 200064 each,
  // 600192 -> 602112.
  o.low_precision_masters = o.bf16_moments = true;
  e = estimate_zero_memory(psi, o);
  EXPECT_EQ(e.nvme_bytes, 3 * 1802240 + 602112);
  EXPECT_EQ(e.optimizer_states, 2 * 1802240);
  // bf16 master, fp32 moments: 600000 + 2 x 1200000 = 3000000 -> 3002368; 200064 + 2 x 400064 =
  // 1000192 -> 1003520.
  o.bf16_moments = false;
  EXPECT_EQ(estimate_zero_memory(psi, o).nvme_bytes, 3 * 3002368 + 1003520);
  // On a GPU at stage 2 the gradient partition stays on the GPU and one sub-group of it lands in
  // host memory at a time, widened to fp32: 1200000 -> 1200128.
  o.gpu = true;
  e = estimate_zero_memory(psi, o);
  EXPECT_EQ(e.optimizer_states, 2 * 3002368 + 1200128);
  EXPECT_EQ(e.host_bytes, e.optimizer_states);
  EXPECT_EQ(e.peak_device(), e.parameters + e.gradients);
  // More buffers than sub-groups: one buffer a sub-group.
  o = options(2, 1);
  o.offload_optimizer = "nvme";
  o.optimizer_buffer_count = 8;
  o.sub_group_size = 500001;  // two sub-groups: 500001 and 500000
  e = estimate_zero_memory(psi, o);
  EXPECT_EQ(e.optimizer_states, 2 * 6000640);  // 500001 x 4 = 2000004 -> 2000064, x 3 -> 6000640
  // Stage 3: the gradient partition in a file as well, a unit's slice of it in memory.
  o = options(2, 3);
  o.offload_optimizer = "nvme";
  o.largest_layer_params = 40000;
  e = estimate_zero_memory(psi, o);
  EXPECT_EQ(e.gradients, 2 * 20000);
  // One sub-group: 1000001 x 4 = 4000004 -> 4000064, x 3 = 12000192 -> 12001280.
  EXPECT_EQ(e.nvme_bytes, 12001280 + 2 * 1000001);
  // offload_param "nvme": max_in_cpu elements stay in memory, the rest in a file read through
  // buffer_count buffers of the largest unit's slice (20000 x 2 = 40000 -> 40960).
  o.offload_optimizer = "cpu";
  o.offload_param = "nvme";
  o.param_max_in_cpu = 100000;
  o.low_precision_masters = true;
  e = estimate_zero_memory(psi, o);
  EXPECT_EQ(e.nvme_bytes, 2 * (1000001 - 100000));
  EXPECT_EQ(e.parameters, 2 * 100000 + 5 * 40960);
  // ... and a 16-bit master is then a copy of the partition, not the partition: 2 + 8 bytes.
  EXPECT_EQ(e.optimizer_states, 10 * 1000001);
  o.param_max_in_cpu = 1000000000;  // the default: all of it in memory, no file
  e = estimate_zero_memory(psi, o);
  EXPECT_EQ(e.nvme_bytes, 0);
  EXPECT_EQ(e.parameters, 2 * 1000001);
  EXPECT_EQ(e.optimizer_states, 8 * 1000001);
}

TEST(EstimateZeroMemory, TableShowsHostAndNvmeColumnsWhenPlaced) {
  auto o = options(8, 0);
  o.gpu = true;
  o.offload_optimizer = "nvme";
  o.offload_param = "cpu";
  const auto table = deepspeed::format_zero_memory_estimates(int64_t{1} << 22, o);
  EXPECT_CONTAINS(table, "on a GPU, optimizer offloaded to nvme, parameters offloaded to cpu");
  EXPECT_CONTAINS(table, "| peak (MB) | on host (MB) | NVMe (MB)\n");
  // Stage 0 ignores the offload: 8 + 8 + 48 MB on the GPU.
  EXPECT_CONTAINS(table, "      0 |             8.0 |            8.0 |           48.0 |"
                         "              64.0 |      64.0 |          0.0 |       0.0\n");
  // Stage 3: 524288 elements a rank; the parameters (1 MB) on the host, the gradients in a file
  // (1 MB; no unit's slice counted without largest_layer_params), the optimizer in a file (6 MB)
  // and in its ring (one sub-group: 6 MB).
  EXPECT_CONTAINS(table, "      3 |             1.0 |            0.0 |            6.0 |"
                         "               7.0 |       7.0 |          7.0 |       7.0\n");
  const auto plain = deepspeed::format_zero_memory_estimates(int64_t{1} << 20, options(8, 0, false));
  EXPECT_EQ(plain.find("on host"), std::string::npos);
  EXPECT_EQ(plain.find("NVMe"), std::string::npos);
  EXPECT_EQ(plain, deepspeed::format_zero_memory_estimates(int64_t{1} << 20, 8));
}

}  // namespace memory_estimate_test
