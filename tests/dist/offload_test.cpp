// ZeRO-Offload / ZeRO-Infinity at 2 ranks: with offload_optimizer.device = "nvme" (stages 1-3) the
// fp32 masters and Adam moments live in files and are streamed through sub-group buffers; with
// offload_param.device = "nvme" (stage 3) the parameter partition lives in a file and each unit's
// slice is read for its all-gather. Training must give bit for bit the losses and weights of the
// in-memory run (the same vectorised Adam on the same numbers), in fp32 and bf16, with sub-groups
// and buffers small enough to exercise the pipelines; "cpu" offload (host memory is this build's
// compute memory) must change nothing at stages 2 and 3. Swapped state must checkpoint and resume
// exactly. I/O problems must stop the job with an error naming the path.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <numeric>

#include "deepspeed/errors.h"
#include "deepspeed/deepspeed.h"
#include "gpt/model.h"
#include "runtime/engine_state.h"
#include "support/checkpoint_run.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/swap_files.h"
#include "support/ranks.h"
#include "support/stage3_models.h"
#include "support/training_run.h"

namespace offload_test {

namespace {

// offload_param nvme: units beyond `max_in_cpu` elements of this rank's partition live in the file.
nlohmann::json param_nvme_config(nlohmann::json c, const std::string& dir, int64_t max_in_cpu) {
  c["zero_optimization"]["offload_param"] = {{"device", "nvme"},   {"nvme_path", dir},
                                             {"buffer_count", 2}, {"buffer_size", 100000},
                                             {"max_in_cpu", max_in_cpu}};
  // The test model's parameters are all small: without this they would all be persistent (root).
  c["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
  c["aio"] = {{"block_size", 8192}, {"queue_depth", 4}};
  return c;
}

void expect_same_training(const dstest::RunResult& got, const dstest::RunResult& want) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < got.losses.size(); ++i)
    EXPECT_EQ(got.losses[i], want.losses[i]) << "step " << i + 1;
  ASSERT_EQ(got.weights.size(), want.weights.size());
  for (size_t i = 0; i < got.weights.size(); ++i)
    EXPECT_TRUE(torch::equal(got.weights[i], want.weights[i])) << "parameter " << i;
  // The norm agrees to double rounding only: the squared norm is a double sum, added up piece by
  // piece where the pieces are stepped or swapped (the ranges taken during backward, the swapped
  // slices) instead of over the whole partition: measured 1.1e-16..1.5e-16 relative, where a
  // float-level difference would be 6e-8.
  EXPECT_LT(dstest::max_grad_norm_rel_diff(got, want), 1e-12);
}

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Each stage-3 unit's slice of the test GPT over `world` ranks, in elements, as
// src/zero/stage3/unit_layout.h lays it out: a unit's parameters padded to world * 16 elements and
// split evenly. [0] is the root unit (embeddings, ln_f, head: the parameters outside every block,
// with stage3_param_persistence_threshold 0), then one per block. Counted from the model's own
// parameters, not from the engine.
std::vector<int64_t> unit_slices(const gpt::GPTConfig& c, int world) {
  auto model = std::make_shared<gpt::GPTImpl>(c);
  std::vector<int64_t> numel(1 + c.n_layer, 0);
  for (const auto& p : model->named_parameters()) {
    const std::string& name = p.key();
    const int unit = name.rfind("block", 0) == 0 ? 1 + std::stoi(name.substr(5)) : 0;
    numel[unit] += p.value().numel();
  }
  std::vector<int64_t> slices;
  for (int64_t n : numel) slices.push_back(round_up(n, world * 16) / world);
  return slices;
}

// The swapped Adam's resident bytes (optimizer_states), from docs/config.md's
// offload_optimizer.buffer_count row: min(buffer_count, sub-groups) buffers each holding one
// sub-group's master, exp_avg and exp_avg_sq (12 bytes per element; the three arrays start on
// 64-byte boundaries, swapped_adam.cpp) rounded up to 4096 bytes; s = the largest sub-group. On
// the CPU the gradients are read where they are: no landing buffer beside them.
std::pair<int64_t, int64_t> swapped_adam_bytes_range(int64_t buffers, int64_t s) {
  return {buffers * 12 * s, buffers * round_up(12 * s + 3 * 64, 4096)};
}

nlohmann::json nvme_config(nlohmann::json c, const std::string& dir, int64_t sub_group, int buffers) {
  c["zero_optimization"]["offload_optimizer"] = {
      {"device", "nvme"}, {"nvme_path", dir}, {"buffer_count", buffers}};
  c["zero_optimization"]["sub_group_size"] = sub_group;
  c["aio"] = {{"block_size", 8192}, {"queue_depth", 4}};
  return c;
}

}  // namespace

// (stage, bf16, buffer_count). Stages 1 and 2 go beyond DeepSpeed, which swaps only at stage 3.
class NvmeOptimizerOffload : public ::testing::TestWithParam<std::tuple<int, bool, int>> {};

TEST_P(NvmeOptimizerOffload, SameLossesAndWeightsAsInMemory) {
  auto [stage, bf16, buffers] = GetParam();
  dstest::RunSpec s;
  s.world_size = 2;
  s.steps = 6;
  s.config = dstest::base_config(2, 2, stage);
  s.config["gradient_clipping"] = 0.5;  // the clip coefficient reaches the swapped kernel too
  if (bf16) s.config["bf16"] = {{"enabled", true}};
  // Stage 3: blocks as units of their own (the test model's parameters would all be persistent),
  // enough of them that the two reductions in flight do not hold every unit's gradients.
  if (stage == 3) {
    s.config["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
    s.model.n_layer = 5;
  }
  auto in_memory = dstest::train_gpt(s);

  dstest::TempDir dir;
  const int64_t sub_group = 3000;
  s.config = nvme_config(s.config, dir.path(), sub_group, buffers);
  auto swapped = dstest::train_gpt(s);
  expect_same_training(swapped, in_memory);
  // Resident optimizer state: the sub-group buffers only (docs/config.md), well under the
  // in-memory 12 or 8 bytes per element of the partition. The largest sub-group s: sub_group_size
  // at stages 1-2; at stage 3 sub-groups are cut inside each unit's slice every sub_group_size
  // rounded up to 4096 elements (the sub_group_size row), so s = min(that, the largest slice).
  // Every case here has at least buffer_count sub-groups of s elements.
  const auto slices = unit_slices(s.model, 2);
  const int64_t largest_slice = *std::max_element(slices.begin(), slices.end());
  const int64_t partition = std::accumulate(slices.begin(), slices.end(), int64_t{0});
  ASSERT_GE(partition, buffers * round_up(sub_group, 4096)) << "fewer sub-groups than buffers";
  const int64_t s_max = stage == 3 ? std::min(round_up(sub_group, 4096), largest_slice) : sub_group;
  ASSERT_GE(s_max, sub_group);
  const auto [low, high] = swapped_adam_bytes_range(buffers, s_max);
  // Stage 3's gradients (offload/grad_store.h), in the weights' dtype. During backward: the slice
  // of the unit being reduced (buckets hold one unit's gradients each and finish in order, so one
  // slice is open at a time), the closed slices whose writes are in flight (at most 2,
  // grad_store.cpp) and the host copies of bucket downloads not yet added (at most 4 pending
  // buckets of reduce_bucket_size, 2000 in base_config): the 3 largest slices + 4 buckets. At the
  // step: the optimizer's reads of up to buffer_count sub-groups ahead plus the one it updates.
  // Well under the whole partition (6 slices).
  auto sorted = slices;
  std::sort(sorted.rbegin(), sorted.rend());
  const int64_t grad_size = bf16 ? 2 : 4;
  const int64_t grad_high =
      grad_size * std::max(sorted[0] + sorted[1] + sorted[2] + 4 * 2000, (buffers + 1) * s_max);
  if (stage == 3) ASSERT_LT(grad_high, grad_size * partition);
  for (int r = 0; r < 2; ++r) {
    const auto& m = swapped.memory[r];
    EXPECT_LT(m.optimizer_states, in_memory.memory[r].optimizer_states) << "rank " << r;
    EXPECT_GE(m.optimizer_states, low) << "rank " << r << ": s " << s_max;
    EXPECT_LE(m.optimizer_states, high) << "rank " << r << ": s " << s_max;
    // Stage 3 swaps the gradient partition too: only the slices being reduced are in memory.
    if (stage == 3) {
      EXPECT_LT(m.gradients, in_memory.memory[r].gradients) << "rank " << r;
      EXPECT_LE(m.gradients, grad_high) << "rank " << r << ": largest slice " << largest_slice;
      EXPECT_GT(m.gradients, 0) << "rank " << r;
    }
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "swap files left behind";
}

INSTANTIATE_TEST_SUITE_P(
    StagesPrecisionAndBuffers, NvmeOptimizerOffload,
    ::testing::Values(std::make_tuple(3, false, 3), std::make_tuple(3, true, 2),
                      std::make_tuple(3, true, 4), std::make_tuple(2, false, 3),
                      std::make_tuple(2, true, 3), std::make_tuple(1, true, 2)),
    [](const auto& info) {
      return "stage" + std::to_string(std::get<0>(info.param)) +
             (std::get<1>(info.param) ? "_bf16" : "_fp32") + "_buffers" +
             std::to_string(std::get<2>(info.param));
    });

// nvme_path is made when missing (as DeepSpeed's os.makedirs(exist_ok=True)); a path that
// cannot be made (under a regular file) is an IOError naming it.
TEST(NvmeOptimizerOffloadErrors, NvmePathThatCannotBeMadeIsNamed) {
  dstest::TempDir dir;
  dstest::write_bytes(dir / "file", "x");
  const std::string bad = dir / "file/nvme/swap";
  dstest::RunSpec s;
  s.world_size = 1;
  s.steps = 1;
  s.config = nvme_config(dstest::base_config(2, 1, 3), bad, 3000, 2);
  try {
    dstest::train_gpt(s);
    FAIL() << "expected IOError";
  } catch (const deepspeed::IOError& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("offload_optimizer.nvme_path"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("Not a directory"), std::string::npos) << e.what();
  }
}

// Both offloads' nvme_path (each rank's) are made when missing, parents included.
TEST(NvmeOffload, MissingNvmePathsAreMade) {
  dstest::TempDir dir;
  const std::string params = dir / "new/params", optim = dir / "new/sub/optim";
  dstest::RunSpec s;
  s.world_size = 2;
  s.steps = 2;
  s.config = nvme_config(dstest::base_config(2, 1, 3), optim, 3000, 2);
  s.config = param_nvme_config(s.config, params, 0);
  auto run = dstest::train_gpt(s);
  EXPECT_EQ(run.losses.size(), 2u);
  EXPECT_TRUE(std::filesystem::is_empty(params)) << "swap files left behind";
  EXPECT_TRUE(std::filesystem::is_empty(optim)) << "swap files left behind";
}

// A step of the swapped optimizer that fails once it has updated some sub-groups (the state file
// cut short under the job) leaves the state partly stepped. engine.step() called again (the
// engine's retry) would step those sub-groups twice, and a checkpoint would keep half a step:
// both are refused, naming the cause, until load_checkpoint brings back a whole state; training
// then goes on.
TEST(NvmeOptimizerOffloadErrors, AStepThatFailsPartwayIsRefusedUntilALoad) {
  dstest::TempDir swap, ckpt;
  auto e =
      dstest::make_single_engine(nvme_config(dstest::base_config(2, 1, 1), swap.path(), 3000, 3));
  auto& engine = *e.engine;
  e.train(1);
  engine.save_checkpoint(ckpt.path(), "one");
  const auto saved = e.weights();

  const auto file = dstest::unlinked_files_in(swap.path());
  ASSERT_EQ(file.size(), 1u) << "stage 1 swaps the optimizer state alone";
  const std::string whole = dstest::read_bytes(file[0]);
  auto batch = e.loader->next();
  engine.backward(engine.forward(batch.data, batch.target));
  ASSERT_EQ(::truncate(file[0].c_str(), static_cast<off_t>(whole.size() / 2)), 0);
  EXPECT_THROW(engine.step(), deepspeed::IOError);
  dstest::write_bytes(file[0], whole);
  ASSERT_TRUE(deepspeed::state_of(engine).stage->step_lost());

  const std::string retried = dstest::message_of<deepspeed::Error>([&] { engine.step(); });
  EXPECT_CONTAINS(retried, "partly stepped");
  EXPECT_CONTAINS(retried, "offload_optimizer.nvme_path");
  const std::string saving =
      dstest::message_of<deepspeed::Error>([&] { engine.save_checkpoint(ckpt.path(), "half"); });
  EXPECT_CONTAINS(saving, "partly stepped");
  EXPECT_CONTAINS(saving, "nvme_path");
  EXPECT_FALSE(std::filesystem::exists(ckpt / "half")) << "a refused save wrote its folder";

  engine.load_checkpoint(ckpt.path(), "one");
  EXPECT_FALSE(deepspeed::state_of(engine).stage->step_lost());
  const auto loaded = e.weights();
  for (size_t i = 0; i < saved.size(); ++i)
    EXPECT_TRUE(torch::equal(loaded[i], saved[i])) << "parameter " << i;
  EXPECT_NO_THROW(e.train(1));
  EXPECT_NO_THROW(engine.save_checkpoint(ckpt.path(), "two"));
}

// offload_param nvme, with and without the optimizer swapped too, every unit in the file
// (max_in_cpu 0) or the first one kept in memory; units read either for the all-gather prefetch
// (the default window holds the whole model) or ahead of it from the file (a 1-element window).
struct ParamCase {
  bool bf16;
  bool optimizer_nvme;
  int64_t max_in_cpu;
  int64_t prefetch_bucket = 50000000;
};

class NvmeParamOffload : public ::testing::TestWithParam<ParamCase> {};

TEST_P(NvmeParamOffload, SameLossesAndWeightsAsInMemory) {
  const ParamCase c = GetParam();
  dstest::RunSpec s;
  s.world_size = 2;
  s.steps = 6;
  s.config = dstest::base_config(2, 2, 3);
  s.config["gradient_clipping"] = 0.5;
  if (c.bf16) s.config["bf16"] = {{"enabled", true}};
  s.config["zero_optimization"]["stage3_param_persistence_threshold"] = 0;  // as with offload
  s.config["zero_optimization"]["stage3_prefetch_bucket_size"] = c.prefetch_bucket;
  s.model.n_layer = 5;  // more units than the store's 2 slice buffers
  auto in_memory = dstest::train_gpt(s);

  dstest::TempDir params, optim;
  s.config = param_nvme_config(s.config, params.path(), c.max_in_cpu);
  if (c.optimizer_nvme) s.config = nvme_config(s.config, optim.path(), 3000, 3);
  auto swapped = dstest::train_gpt(s);
  expect_same_training(swapped, in_memory);
  // Resident parameters: the memory part plus buffer_count slice buffers (the pool) and, with the
  // optimizer swapped, the two staging buffers its updated sub-groups are written from (each one
  // sub-group of the file's 16-bit values, rounded up to 4096 bytes: param_store.cpp). From
  // docs/config.md's offload_param rows: the root unit stays in memory, units 1, 2, ... too while
  // their slices total <= max_in_cpu; the pool's buffer_count (2, param_nvme_config) buffers each
  // hold the largest slice in the file.
  const auto slices = unit_slices(s.model, 2);
  int64_t memory_part = slices[0], kept = 0;
  size_t first_in_file = 1;
  while (first_in_file < slices.size() && kept + slices[first_in_file] <= c.max_in_cpu)
    kept += slices[first_in_file++];
  memory_part += kept;
  ASSERT_LT(first_in_file, slices.size()) << "no unit in the file";
  const int64_t largest_in_file = *std::max_element(slices.begin() + first_in_file, slices.end());
  const int64_t param_size = c.bf16 ? 2 : 4;
  const int64_t staging =
      c.optimizer_nvme
          ? 2 * round_up(param_size * std::min(round_up(3000, 4096), largest_in_file), 4096)
          : 0;
  const int64_t pool_buffers = 2;
  for (int r = 0; r < 2; ++r) {
    const int64_t got = swapped.memory[r].parameters;
    EXPECT_LT(got, in_memory.memory[r].parameters) << "rank " << r;
    EXPECT_LE(got, param_size * (memory_part + pool_buffers * largest_in_file) + staging)
        << "rank " << r << ": memory part " << memory_part << ", largest slice in the file "
        << largest_in_file;
    // At least the memory part and one pool buffer (every unit in the file was read).
    EXPECT_GE(got, param_size * (memory_part + largest_in_file)) << "rank " << r;
  }
  EXPECT_TRUE(std::filesystem::is_empty(params.path())) << "parameter swap files left behind";
}

INSTANTIATE_TEST_SUITE_P(
    Offload, NvmeParamOffload,
    ::testing::Values(ParamCase{false, true, 0}, ParamCase{true, true, 0},
                      ParamCase{true, true, 0, 1}, ParamCase{true, true, 7000},
                      ParamCase{false, false, 0}, ParamCase{true, false, 0, 1}),
    [](const auto& info) {
      return std::string(info.param.bf16 ? "bf16" : "fp32") +
             (info.param.optimizer_nvme ? "_optimizer_nvme" : "_optimizer_in_memory") +
             "_max_in_cpu" + std::to_string(info.param.max_in_cpu) +
             (info.param.prefetch_bucket == 1 ? "_read_ahead" : "");
    });

// An eval-only forward leaves gathers in flight (prefetched for the backward that never comes),
// each holding its slice buffer of the parameter swap file when the store is in a file, and
// their gathered copies. Between backward and step, the step then writes every slice (one pool
// buffer to recycle) and must not leave those copies stale; before a checkpoint load, the load
// writes them. Either must go on exactly as without the eval forward: the weights seen through
// gathered_parameters after it and the losses of the steps that follow.
enum class EvalBefore { kStep, kLoad };
// kZeroPP: in memory, with qwZ and hpZ (groups of 2 of 4 ranks: the secondaries of a backward
// that is not coming).
enum class Swap { kNone, kZeroPP, kParams, kParamsAndOptimizer };

class EvalForward : public ::testing::TestWithParam<std::tuple<EvalBefore, Swap>> {};

TEST_P(EvalForward, ChangesNothing) {
  const auto [before, swap] = GetParam();
  dstest::TempDir params, optim, ckpt;
  auto config = dstest::stage3_test_config(3);
  if (swap != Swap::kNone) {
    config = param_nvme_config(config, params.path(), 0);
    config["zero_optimization"]["offload_param"]["buffer_count"] = 1;  // recycling at every read
  }
  if (swap == Swap::kParamsAndOptimizer) config = nvme_config(config, optim.path(), 3000, 3);
  if (swap == Swap::kZeroPP) {
    config["zero_optimization"]["zero_quantized_weights"] = true;
    config["zero_optimization"]["zero_hpz_partition_size"] = 2;
  }
  const int world = swap == Swap::kZeroPP ? 4 : 2;
  torch::manual_seed(11);
  const auto start = std::make_shared<dstest::OuterModelImpl>();
  std::vector<double> losses[2];          // [eval forward], rank 0's
  std::vector<torch::Tensor> weights[2];  // after the step or the load, rank 0's
  for (bool eval : {false, true}) {
    run_ranks(world, [&](deepspeed::comm::CommunicatorPtr comm) {
      const int rank = comm->rank();
      auto model = std::make_shared<dstest::OuterModelImpl>();
      {
        torch::NoGradGuard no_grad;
        auto from = start->parameters();
        auto to = model->parameters();
        for (size_t i = 0; i < to.size(); ++i) to[i].copy_(from[i]);
      }
      auto engine = deepspeed::initialize<dstest::OuterModelImpl>(
                        {.model = model, .config_json = config, .comm = comm})
                        .engine;
      auto eval_forward = [&] {
        if (!eval) return;
        torch::NoGradGuard no_grad;
        auto b = dstest::token_batch(rank, 7);
        engine->forward(b.idx, b.targets);
      };
      auto train_step = [&](int64_t step, bool eval_before_step) {
        auto b = dstest::token_batch(rank, step);
        auto loss = engine->forward(b.idx, b.targets);
        engine->backward(loss);
        if (eval_before_step) eval_forward();
        engine->step();
        return loss.item<double>();
      };
      train_step(0, false);  // the trace: later forwards prefetch
      if (before == EvalBefore::kLoad && !eval) engine->save_checkpoint(ckpt.path(), "one");
      comm->barrier();
      train_step(1, before == EvalBefore::kStep);
      if (before == EvalBefore::kLoad) {
        eval_forward();
        engine->load_checkpoint(ckpt.path(), "one");
      }
      {
        auto whole = engine->gathered_parameters();
        if (rank == 0)
          for (auto& p : model->parameters()) weights[eval].push_back(p.detach().clone());
      }
      for (int64_t step = 2; step < 4; ++step) {
        const double loss = train_step(step, false);
        if (rank == 0) losses[eval].push_back(loss);
      }
    });
  }
  ASSERT_EQ(weights[true].size(), weights[false].size());
  for (size_t i = 0; i < weights[true].size(); ++i)
    EXPECT_TRUE(torch::equal(weights[true][i], weights[false][i])) << "parameter " << i;
  ASSERT_EQ(losses[true].size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(losses[true][i], losses[false][i]) << "step " << i + 3;
  EXPECT_TRUE(std::filesystem::is_empty(params.path())) << "parameter swap files left behind";
}

INSTANTIATE_TEST_SUITE_P(
    Stage3, EvalForward,
    ::testing::Combine(::testing::Values(EvalBefore::kStep, EvalBefore::kLoad),
                       ::testing::Values(Swap::kNone, Swap::kZeroPP, Swap::kParams,
                                         Swap::kParamsAndOptimizer)),
    [](const auto& info) {
      const EvalBefore before = std::get<0>(info.param);
      const Swap swap = std::get<1>(info.param);
      return std::string(before == EvalBefore::kStep ? "BeforeTheStep" : "BeforeALoad") +
             (swap == Swap::kNone     ? "_InMemory"
              : swap == Swap::kZeroPP ? "_InMemoryWithQwzAndHpz"
              : swap == Swap::kParams ? "_ParamsInAFile"
                                      : "_ParamsAndOptimizerInFiles");
    });

// On this CPU-only build "cpu" offload keeps the states where they already are: it must train
// exactly as without offload (and must not be rejected) at stages 2 and 3.
TEST(CpuOffload, SameLossesAndWeightsAtStages2And3) {
  for (int stage : {2, 3}) {
    dstest::RunSpec s;
    s.world_size = 2;
    s.steps = 4;
    s.config = dstest::base_config(2, 1, stage);
    s.config["bf16"] = {{"enabled", true}};
    auto plain = dstest::train_gpt(s);
    s.config["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
    if (stage == 3) s.config["zero_optimization"]["offload_param"] = {{"device", "cpu"}};
    auto offloaded = dstest::train_gpt(s);
    SCOPED_TRACE("stage " + std::to_string(stage));
    expect_same_training(offloaded, plain);
  }
}

// offload_optimizer.overlap_step (zero/step_during_backward.h): each bucket's (stage 3: each
// unit's) range of the partition is updated while backward goes on. Over two ranks with
// accumulation, at stages 1-3, in fp32 and bf16, training must be bit for bit the serial step's;
// the unit test step_during_backward_test shows the ranges really are updated before step().
TEST(CpuOffload, UpdateDuringBackwardTrainsAsTheSerialStep) {
  for (int stage : {1, 2, 3}) {
    for (bool bf16 : {false, true}) {
      dstest::RunSpec s;
      s.world_size = 2;
      s.steps = 4;
      s.config = dstest::base_config(2, 2, stage);
      if (bf16) s.config["bf16"] = {{"enabled", true}};
      if (stage == 3) {  // blocks as units of their own, their slices in host memory
        s.config["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
        s.config["zero_optimization"]["offload_param"] = {{"device", "cpu"}};
        s.model.n_layer = 3;
      }
      s.config["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"},
                                                            {"overlap_step", false}};
      auto serial = dstest::train_gpt(s);
      s.config["zero_optimization"]["offload_optimizer"]["overlap_step"] = true;
      auto overlapped = dstest::train_gpt(s);
      SCOPED_TRACE("stage " + std::to_string(stage) + (bf16 ? " bf16" : " fp32"));
      expect_same_training(overlapped, serial);
    }
  }
}

// With clipping the update needs the whole gradient: overlap_step then only takes the ranges
// during backward and updates them at the step, with the clip coefficient. Same training. (fp16,
// whose overflowed steps drop the taken ranges, has no CPU kernels for this model:
// step_during_backward_test covers the drop.)
TEST(CpuOffload, RangesTakenDuringBackwardWithClippingTrainAsTheSerialStep) {
  dstest::RunSpec s;
  s.world_size = 2;
  s.steps = 6;
  s.config = dstest::base_config(2, 2, 2);
  s.config["gradient_clipping"] = 0.05;  // clips every step
  s.config["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}, {"overlap_step", false}};
  auto serial = dstest::train_gpt(s);
  s.config["zero_optimization"]["offload_optimizer"]["overlap_step"] = true;
  auto overlapped = dstest::train_gpt(s);
  expect_same_training(overlapped, serial);
}

TEST(NvmeParamOffloadErrors, NvmePathThatCannotBeMadeIsNamed) {
  dstest::TempDir dir;
  dstest::write_bytes(dir / "file", "x");
  const std::string bad = dir / "file/param/swap";
  dstest::RunSpec s;
  s.world_size = 1;
  s.steps = 1;
  s.config = param_nvme_config(dstest::base_config(2, 1, 3), bad, 0);
  try {
    dstest::train_gpt(s);
    FAIL() << "expected IOError";
  } catch (const deepspeed::IOError& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("offload_param.nvme_path"), std::string::npos) << e.what();
  }
}

TEST(NvmeParamOffloadErrors, BufferSmallerThanAParameterPartitionNamesTheKey) {
  dstest::TempDir dir;
  dstest::RunSpec s;
  s.world_size = 1;
  s.steps = 1;
  s.config = param_nvme_config(dstest::base_config(2, 1, 3), dir.path(), 0);
  s.config["zero_optimization"]["offload_param"]["buffer_size"] = 100;
  try {
    dstest::train_gpt(s);
    FAIL() << "expected ConfigError";
  } catch (const deepspeed::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("offload_param.buffer_size"), std::string::npos) << e.what();
  }
}

// Swapped optimizer and parameter state is saved and resumed: the steps after the checkpoint are
// bit-identical to the uninterrupted run's, and the checkpoint loads into an in-memory run too.
TEST(NvmeOffloadCheckpoint, ResumesBitIdentically) {
  for (auto [stage, bf16] : {std::pair{3, false}, std::pair{3, true}, std::pair{2, true}}) {
    SCOPED_TRACE("stage " + std::to_string(stage) + (bf16 ? " bf16" : " fp32"));
    dstest::TempDir params, optim, ckpt;
    dstest::CheckpointJob full;
    full.world_size = 2;
    full.steps = 8;
    full.config = dstest::base_config(2, 1, stage);
    if (bf16) full.config["bf16"] = {{"enabled", true}};
    full.config = nvme_config(full.config, optim.path(), 3000, 3);
    if (stage == 3) full.config = param_nvme_config(full.config, params.path(), 0);
    full.save_dir = ckpt.path();
    full.save_at = {4};
    auto uninterrupted = dstest::run_checkpoint_job(full);
    ASSERT_EQ(uninterrupted.losses.size(), 8u);

    dstest::CheckpointJob resumed = full;
    resumed.save_at = {};
    resumed.load_dir = ckpt.path();
    resumed.model_seed = 4242;
    auto second = dstest::run_checkpoint_job(resumed);
    EXPECT_EQ(second.start_step, 4);
    ASSERT_EQ(second.losses.size(), 4u);
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(second.losses[i], uninterrupted.losses[4 + i]) << "step " << 5 + i;
    ASSERT_EQ(second.weights.size(), uninterrupted.weights.size());
    for (size_t i = 0; i < second.weights.size(); ++i)
      EXPECT_TRUE(torch::equal(second.weights[i], uninterrupted.weights[i])) << "parameter " << i;

    // The same checkpoint in a run without offload continues the same way.
    dstest::CheckpointJob plain = resumed;
    plain.config.erase("aio");
    plain.config["zero_optimization"].erase("offload_optimizer");
    plain.config["zero_optimization"].erase("offload_param");
    auto third = dstest::run_checkpoint_job(plain);
    ASSERT_EQ(third.losses.size(), 4u);
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(third.losses[i], uninterrupted.losses[4 + i]) << "step " << 5 + i;
  }
}

}  // namespace offload_test
