// The memory report against the ZeRO paper's fp32 formulas (Ψ parameters, N ranks, Adam):
//   stage 0: 4Ψ weights + 4Ψ gradients + 8Ψ moments            = 16Ψ
//   stage 1: 4Ψ + 4Ψ + 8Ψ/N                                     = 8Ψ + 8Ψ/N   (the paper's)
//   stage 2: 4Ψ + 4Ψ/N + 8Ψ/N                                   = 4Ψ + 12Ψ/N
// Stage 1 here reduce-scatters at the accumulation boundary into a partition: stage 2's figure
// with one micro-step, and 4Ψ more (autograd's .grad between micro-steps) with accumulation,
// 8Ψ + 12Ψ/N (include/deepspeed/memory.h).
//   stage 3: 4Ψ/N + 4Ψ/N + 8Ψ/N                                 = 16Ψ/N (+ the gathered working set,
//            reported apart: MemoryReport::gathered_bytes)
// In fp32 the rank's slice of the flat parameter buffer is the master copy, so no extra 4Ψ/N.
// Allowed slack: 5% (padding to 16·N elements is far below that); bucket buffers are reported
// separately as comm_buffers and must stay within the configured bucket sizes (stages 0-2).
// Other optimizers' state is counted byte for byte against the tensors it really holds:
// Adagrad's sum, and the 1-bit optimizers' buffers beside their moments.
#include <gtest/gtest.h>
#include <torch/optim/adagrad.h>

#include <algorithm>
#include <mutex>

#include "optim/onebit_adam.h"
#include "optim/onebit_lamb.h"
#include "optim/zero_one_adam.h"
#include "support/training_run.h"

namespace zero_memory_test {

namespace {
double expected_bytes(int stage, double psi, int n) {
  switch (stage) {
    case 0: return 16 * psi;
    case 1:  // with one micro-step per step (base_config(2, 1, ...))
    case 2: return 4 * psi + 12 * psi / n;
    default: return 16 * psi / n;
  }
}
}  // namespace

class ZeroMemory : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(ZeroMemory, ModelStatesMatchTheFormula) {
  auto [world, stage] = GetParam();
  dstest::RunSpec s;
  s.world_size = world;
  s.steps = 2;
  s.config = dstest::base_config(2, 1, stage);
  const int64_t bucket = 2000;
  s.config["zero_optimization"]["reduce_bucket_size"] = bucket;
  auto r = dstest::train_gpt(s);
  const double psi = static_cast<double>(dstest::count_parameters(s.model));
  for (int rank = 0; rank < world; ++rank) {
    const auto& m = r.memory[rank];
    double want = expected_bytes(stage, psi, world);
    EXPECT_NEAR(m.model_states(), want, 0.05 * want)
        << "stage " << stage << " world " << world << " rank " << rank << ": params "
        << m.parameters << " grads " << m.gradients << " optimizer " << m.optimizer_states;
    // On the CPU every byte is host memory (tests/unit/stage_device_test: none on a device).
    EXPECT_EQ(m.host_bytes, m.total()) << "stage " << stage << " rank " << rank;
    EXPECT_EQ(m.device_bytes(), 0);
    if (stage <= 2) {
      // Stage 2 (and fp32 stage 0): a pool of equal-size bucket buffers, each of the largest
      // bucket (at most reduce_bucket_size, or the largest parameter, 256 x 32 elements, alone)
      // in fp32: 2 in flight + 1 filling, and at stage 2 one more when a gradient arrives before
      // that of the parameter laid before it in another bucket (a Linear's weight before its
      // bias: 32 + 4096 elements are two buckets of at most 2000).
      // Stage 1 reduces views of its gradient buffer: none. Never a copy of every gradient (4Ψ),
      // which would be held through the forward pass.
      EXPECT_LE(m.comm_buffers, 4 * std::max<int64_t>(bucket, 256 * 32) * 4)
          << "stage " << stage << " world " << world << " rank " << rank;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formulas, ZeroMemory,
                         ::testing::Combine(::testing::Values(1, 2, 4), ::testing::Values(0, 1, 2, 3)));

// Stage 1 with gradient accumulation: the partition (Ψ/N) and autograd's .grad between the
// micro-steps (Ψ); the estimate told the accumulation agrees. Accumulating wider than the
// weights (bf16 with fp32 accumulation) it all-reduces one fp32 buffer of every gradient: 4Ψ.
TEST(ZeroMemory, Stage1AccumulatingHoldsTheGradsBetweenMicroSteps) {
  for (int world : {1, 2}) {
    for (bool bf16_fp32_accumulation : {false, true}) {
      SCOPED_TRACE("world " + std::to_string(world) +
                   (bf16_fp32_accumulation ? ", bf16 accumulating in fp32" : ", fp32"));
      dstest::RunSpec s;
      s.world_size = world;
      s.steps = 2;
      s.config = dstest::base_config(1, 2, 1);
      if (bf16_fp32_accumulation) {
        s.config["bf16"] = {{"enabled", true}};
        s.config["data_types"] = {{"grad_accum_dtype", "fp32"}};
      }
      auto r = dstest::train_gpt(s);
      const int64_t psi = dstest::count_parameters(s.model);
      const double want = bf16_fp32_accumulation ? 4.0 * psi : 4.0 * psi + 4.0 * psi / world;
      const auto e = deepspeed::estimate_zero_memory(psi, world, 1, bf16_fp32_accumulation, 1, 0,
                                                     bf16_fp32_accumulation ? 4 : 0, false, 2);
      EXPECT_NEAR(static_cast<double>(e.gradients), want, 0.05 * want);
      for (int rank = 0; rank < world; ++rank) {
        EXPECT_NEAR(static_cast<double>(r.memory[rank].gradients), want, 0.05 * want)
            << "rank " << rank;
        EXPECT_NEAR(static_cast<double>(r.memory[rank].model_states()),
                    static_cast<double>(e.model_states()), 0.05 * e.model_states())
            << "rank " << rank;
      }
    }
  }
}

// A bucket whose dtype differs from communication_data_type travels as a converted copy (its
// "wire"). Those copies are held only while in flight (at most 2, + 1 being launched) and counted
// in comm_buffers: bf16 stages 0 and 1 accumulating in
// fp32 (GAS 2) with bf16 communication (which all-reduce views of their gradient buffer:
// unbounded, every bucket's copy would be alive at the end of backward, 4Ψ or 2Ψ bytes), and
// fp32 stage 0 with fp16 communication (its pool buffers are counted beside them).
TEST(ZeroMemory, WireCopiesOfAllReduceBucketsAreBoundedAndCounted) {
  struct Case {
    int stage, accumulation;
    const char* comm;
    int64_t wire_element;  // bytes
    bool bf16;
  };
  for (const Case& c : {Case{0, 2, "bf16", 2, true}, Case{1, 2, "bf16", 2, true},
                        Case{0, 1, "fp16", 2, false}}) {
    SCOPED_TRACE("stage " + std::to_string(c.stage) + ", communication in " + c.comm);
    dstest::RunSpec s;
    s.world_size = 2;
    s.steps = 1;
    s.model = gpt::GPTConfig{256, 16, 6, 2, 32};  // Ψ = 93184, against buckets of ≤ 8192
    const int64_t bucket = 2000;
    s.config = dstest::base_config(1, c.accumulation, c.stage);
    s.config["zero_optimization"]["reduce_bucket_size"] = bucket;
    if (c.bf16) s.config["bf16"] = {{"enabled", true}};
    // Stage 1 all-reduces only when it accumulates wider than its weights (else it scatters).
    if (c.stage == 1) s.config["data_types"] = {{"grad_accum_dtype", "fp32"}};
    s.config["communication_data_type"] = c.comm;
    auto r = dstest::train_gpt(s);
    const int64_t psi = dstest::count_parameters(s.model);
    const int64_t largest = 256 * 32;  // wte, a bucket of its own
    // fp32 stage 0's pool buffers: what the same run holds without the conversion.
    std::vector<int64_t> pool(2, 0);
    if (!c.bf16) {
      s.config.erase("communication_data_type");
      auto plain = dstest::train_gpt(s);
      for (int rank = 0; rank < 2; ++rank) pool[rank] = plain.memory[rank].comm_buffers;
    }
    for (int rank = 0; rank < 2; ++rank) {
      const int64_t held = r.memory[rank].comm_buffers - pool[rank];
      EXPECT_GE(held, largest * c.wire_element) << "rank " << rank << ": not counted";
      EXPECT_LE(held, 3 * std::max(bucket, largest) * c.wire_element) << "rank " << rank;
      EXPECT_LT(held, psi * c.wire_element / 2) << "rank " << rank;
    }
  }
}

TEST(ZeroMemory, Stage2AtMostTwoThirdsOfStage0AtTwoRanksAndUnderHalfAtFour) {
  for (auto [world, limit] : {std::pair{2, 0.66}, std::pair{4, 0.47}}) {
    std::vector<double> states;
    for (int stage : {0, 2}) {
      dstest::RunSpec s;
      s.world_size = world;
      s.steps = 1;
      s.config = dstest::base_config(1, 1, stage);
      states.push_back(dstest::train_gpt(s).memory[0].model_states());
    }
    EXPECT_LE(states[1] / states[0], limit) << "world " << world;
  }
}

TEST(ZeroFrozen, FrozenParameterIsNeverUpdatedAndTrainingMatchesStage0) {
  for (int stage : {0, 1, 2}) {
    dstest::RunSpec s;
    s.world_size = 2;
    s.steps = 5;
    s.frozen = {"wpe.weight"};
    s.config = dstest::base_config(2, 1, stage);
    auto r = dstest::train_gpt(s);
    dstest::RunSpec ref = s;
    ref.config = dstest::base_config(2, 1, 0);
    auto reference = dstest::train_gpt(ref);
    // wpe.weight is the second registered parameter.
    EXPECT_TRUE(torch::equal(r.weights[1], r.initial[1])) << "stage " << stage;
    EXPECT_LT(dstest::max_weight_diff(r, reference), 1e-4) << "stage " << stage;
    EXPECT_LT(dstest::max_grad_norm_rel_diff(r, reference), dstest::kGradNormTol)
        << "stage " << stage;
  }
}

// A frozen parameter (requires_grad false) belongs to no stage: it stays whole in the module at
// every stage, and memory_report() counts it in `parameters` all the same, in the memory it lives
// in (here the CPU: host memory). Frozen wte (256 x 32 fp32, a quarter of the model): its 4F bytes
// whole beside the trainable rest, which stage 3 partitions.
TEST(ZeroFrozen, FrozenParametersAreCountedWholeInTheReport) {
  const int world = 2;
  for (int stage : {0, 1, 2, 3}) {
    dstest::RunSpec s;
    s.world_size = world;
    s.steps = 1;
    s.frozen = {"wte.weight"};
    s.config = dstest::base_config(2, 1, stage);
    s.config["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
    auto r = dstest::train_gpt(s);
    const double frozen = 4.0 * 256 * 32;
    const double trainable = 4.0 * dstest::count_parameters(s.model) - frozen;
    const double want = frozen + (stage == 3 ? trainable / world : trainable);
    for (int rank = 0; rank < world; ++rank) {
      const auto& m = r.memory[rank];
      EXPECT_NEAR(m.parameters, want, 0.02 * want) << "stage " << stage << " rank " << rank;
      EXPECT_EQ(m.host_bytes, m.total()) << "stage " << stage << " rank " << rank;
    }
  }
}

namespace {
using nlohmann::json;

int64_t nbytes(const torch::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
}

// Adagrad's per-parameter sums, as the optimizer holds them.
int64_t adagrad_sum_bytes(deepspeed::Engine& e) {
  int64_t total = 0;
  for (auto& [key, state] : e.optimizer()->state())
    total += nbytes(dynamic_cast<torch::optim::AdagradParamState&>(*state).sum());
  return total;
}

// exp_avg and exp_avg_sq of every parameter (the 1-bit optimizers keep AdamW's state).
int64_t moment_bytes(torch::optim::Optimizer& o) {
  int64_t total = 0;
  for (auto& [key, state] : o.state()) {
    auto& s = dynamic_cast<torch::optim::AdamWParamState&>(*state);
    total += nbytes(s.exp_avg()) + nbytes(s.exp_avg_sq());
  }
  return total;
}

int64_t error_bytes(const deepspeed::optim::CompressedAllReduce* c) {
  return c ? nbytes(c->worker_error()) + nbytes(c->server_error()) : 0;
}

// The 1-bit optimizers' buffers beside the moments, read from the tensors that hold them (0/1
// Adam's u and last-sync parameters, and 1-bit Lamb's fresh variance, through extra_state(),
// whose copies have their element counts).
int64_t onebit_extra_bytes(torch::optim::Optimizer& o) {
  namespace optim = deepspeed::optim;
  if (auto* a = dynamic_cast<optim::OneBitAdam*>(&o)) return error_bytes(a->compressor());
  if (auto* z = dynamic_cast<optim::ZeroOneAdam*>(&o)) {
    const auto saved = z->extra_state();
    int64_t total = 0;
    for (const char* name : {"worker_error", "server_error", "local_updates", "synced_params"})
      total += nbytes(saved.per_rank.at(name));
    return total;
  }
  auto& l = dynamic_cast<optim::OneBitLamb&>(o);
  return error_bytes(l.compressor()) + nbytes(l.extra_state().replicated.at("exp_avg_sq_fresh")) +
         static_cast<int64_t>(sizeof(double) * (l.coeff_freeze().size() + l.last_factor().size()));
}
}  // namespace

// Adagrad (the config's and a client's) keeps one fp32 sum per element of the rank's partition:
// optimizer_states is those bytes exactly (in fp32 the partition is its own master).
TEST(ZeroMemory, AdagradSumsAreTheOptimizerStates) {
  const json config_adagrad = {{"type", "Adagrad"}, {"params", {{"lr", 0.01}}}};
  for (bool client : {false, true}) {
    for (int stage : {0, 1, 2, 3}) {
      SCOPED_TRACE(std::string(client ? "client" : "config") + " Adagrad, stage " +
                   std::to_string(stage));
      dstest::RunSpec s;
      s.world_size = 2;
      s.steps = 2;
      s.config = dstest::base_config(2, 1, stage);
      if (client) {
        s.config.erase("optimizer");
        s.client_optimizer = [](gpt::GPTImpl& m) {
          return std::make_shared<torch::optim::Adagrad>(m.parameters(),
                                                         torch::optim::AdagradOptions(0.01));
        };
      } else {
        s.config["optimizer"] = config_adagrad;
      }
      auto [r, held] = dstest::train_measuring(s, adagrad_sum_bytes);
      const int64_t psi = dstest::count_parameters(s.model);
      for (int rank = 0; rank < 2; ++rank) {
        EXPECT_EQ(r.memory[rank].optimizer_states, held[rank]) << "rank " << rank;
        // The whole model's sums at stage 0; about half of them (and padding) at stages 1-3.
        if (stage == 0) EXPECT_EQ(held[rank], 4 * psi) << "rank " << rank;
        if (stage > 0) EXPECT_NEAR(held[rank], 2 * psi, 0.05 * psi) << "rank " << rank;
      }
    }
  }
}

// 1-bit Adam, 0/1 Adam and 1-bit Lamb past their warm-up hold, beside the moments, the error
// feedback of the compressed all-reduce ([W, S] worker and [S] server error), 0/1 Adam's local
// updates and last-sync parameters, 1-bit Lamb's fresh variance and per-tensor coeff_freeze and
// last_factor: all counted in optimizer_states, with the fp32 master in 16 bits.
TEST(ZeroMemory, OneBitBuffersAreInTheOptimizerStates) {
  struct Case {
    const char* type;
    json params;
    bool bf16;
  };
  const json adam = {{"lr", 1e-3}, {"freeze_step", 2}};
  const json zero_one = {{"lr", 1e-3}, {"var_freeze_step", 2}};  // phase 2 from step 4
  const json lamb = {{"lr", 0.01}, {"freeze_step", 2}};
  for (const Case& c : {Case{"OneBitAdam", adam, false}, Case{"OneBitAdam", adam, true},
                        Case{"ZeroOneAdam", zero_one, false}, Case{"ZeroOneAdam", zero_one, true},
                        Case{"OneBitLamb", lamb, false}}) {
    SCOPED_TRACE(std::string(c.type) + (c.bf16 ? ", bf16" : ", fp32"));
    dstest::RunSpec s;
    s.world_size = 2;
    s.steps = 5;
    s.config = dstest::base_config(2, 1, 0);
    s.config["optimizer"] = {{"type", c.type}, {"params", c.params}};
    if (c.bf16) s.config["bf16"] = {{"enabled", true}};
    std::vector<int64_t> extra(2, 0);
    std::mutex mu;
    auto [r, held] = dstest::train_measuring(s, [&](deepspeed::Engine& e) {
      auto& o = *e.optimizer();
      const int64_t x = onebit_extra_bytes(o);
      {
        std::lock_guard<std::mutex> lock(mu);
        extra[e.communicator()->rank()] = x;
      }
      // In 16 bits the optimizer steps one flat fp32 master, a copy beside the bf16 parameters.
      const int64_t master = c.bf16 ? nbytes(o.param_groups().at(0).params().at(0)) : 0;
      return moment_bytes(o) + x + master;
    });
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_GT(extra[rank], 0) << "rank " << rank << ": the buffers exist after the warm-up";
      EXPECT_EQ(r.memory[rank].optimizer_states, held[rank]) << "rank " << rank;
    }
  }
}

}  // namespace zero_memory_test
