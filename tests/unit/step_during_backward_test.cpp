// ZeRO-Offload's update during backward (zero/step_during_backward.h), on CPU tensors: the ranges
// of one FusedAdam step give bit for bit the whole step; the worker thread runs tasks in order and
// reports the first failure; and a flat stage (1 and 2) with offload_optimizer.overlap_step
// updates its partition while backward is still reducing, with the same parameters, moments and
// step count as the serial step.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include <torch/torch.h>

#include "deepspeed/comm.h"
#include "deepspeed/config.h"
#include "deepspeed/errors.h"
#include "offload/step_worker.h"
#include "support/failing_cpu_allocator.h"
#include "optim/adamw_state.h"
#include "optim/fused_adam.h"
#include "util/torch_compat.h"
#include "zero/flat_stage.h"
#include "zero/stage_options.h"
#include "zero/step_during_backward.h"
#include "support/adam_hyper.h"

namespace step_during_backward_test {

using deepspeed::zero::FlatStage;
using deepspeed::zero::FlatStageOptions;
using deepspeed::zero::OffloadDevice;
using deepspeed::zero::StageContext;

namespace {

torch::optim::AdamWParamState& state_of(torch::optim::Optimizer& o, const at::Tensor& p) {
  return static_cast<torch::optim::AdamWParamState&>(
      *o.state().at(deepspeed::compat::optimizer_state_key(p)));
}

}  // namespace

TEST(AdamRangeStep, RangesGiveTheWholeStepBitForBit) {
  for (bool half : {false, true}) {
    torch::manual_seed(3);
    at::Tensor start = torch::randn({1037});
    at::Tensor whole = start.clone(), ranged = start.clone();
    at::Tensor whole16 = torch::empty({1037}, torch::kBFloat16), ranged16 = whole16.clone();
    deepspeed::optim::FusedAdam a({whole}, dstest::decaying_adam_hyper()),
        b({ranged}, dstest::decaying_adam_hyper());
    if (half) {
      a.set_half_copy(whole, whole16);
      b.set_half_copy(ranged, ranged16);
    }
    for (int step = 0; step < 3; ++step) {
      at::Tensor grad = torch::randn({1037});
      whole.mutable_grad() = grad;
      a.step();
      auto r = b.prepare_step(ranged);
      EXPECT_EQ(r.hyper.step, step + 1);
      // Out of order and uneven, as buckets finish.
      for (auto [begin, n] : {std::pair<int64_t, int64_t>{500, 537}, {0, 17}, {17, 483}})
        r.run(grad.data_ptr<float>() + begin, begin, n);
    }
    EXPECT_TRUE(torch::equal(whole, ranged)) << "half " << half;
    if (half) EXPECT_TRUE(torch::equal(whole16, ranged16));
    EXPECT_TRUE(torch::equal(state_of(a, whole).exp_avg(), state_of(b, ranged).exp_avg()));
    EXPECT_TRUE(torch::equal(state_of(a, whole).exp_avg_sq(), state_of(b, ranged).exp_avg_sq()));
    EXPECT_EQ(state_of(b, ranged).step(), 3);
  }
}

// A client optimizer's parameter groups over the master (FusedAdam::set_flat): ranges that cross
// the groups' segments are cut there, each part stepped with its group's options as they are when
// the step is prepared (an lr changed between steps is followed). The reference steps each
// segment as a tensor of its own with its group's options.
TEST(AdamRangeStep, RangesAcrossGroupSegmentsStepEachWithItsGroup) {
  using Segment = deepspeed::optim::FusedAdam::Segment;
  const std::vector<Segment> segments{{0, 100, 0}, {100, 3, 1}, {103, 497, 0}, {600, 437, 2}};
  std::vector<deepspeed::AdamHyper> groups(3, dstest::decaying_adam_hyper());
  groups[1].lr = 0.0;
  groups[1].weight_decay = 0.0;
  groups[2].lr = 3e-3;
  groups[2].beta2 = 0.95;
  groups[2].eps = 1e-6;
  groups[2].weight_decay = 0.0;
  for (bool half : {false, true}) {
    torch::manual_seed(5);
    at::Tensor start = torch::randn({1037});
    at::Tensor ranged = start.clone(), ranged16 = torch::empty({1037}, torch::kBFloat16);
    deepspeed::optim::FusedAdam b({ranged}, groups[0]);
    for (size_t g = 1; g < groups.size(); ++g)
      b.add_param_group(torch::optim::OptimizerParamGroup(
          std::vector<at::Tensor>(), std::make_unique<torch::optim::AdamWOptions>(
                                         deepspeed::optim::adamw_options(groups[g]))));
    b.set_flat(ranged, segments);
    if (half) b.set_half_copy(ranged, ranged16);
    std::vector<at::Tensor> pieces, pieces16;
    std::vector<std::unique_ptr<deepspeed::optim::FusedAdam>> reference;
    for (const auto& seg : segments) {
      pieces.push_back(start.narrow(0, seg.begin, seg.numel).clone());
      pieces16.push_back(torch::empty({seg.numel}, torch::kBFloat16));
      reference.push_back(
          std::make_unique<deepspeed::optim::FusedAdam>(std::vector<at::Tensor>{pieces.back()},
                                                        groups[seg.group]));
      if (half) reference.back()->set_half_copy(pieces.back(), pieces16.back());
    }
    for (int step = 0; step < 3; ++step) {
      if (step == 2) {  // a scheduler moves group 2's lr (only)
        static_cast<torch::optim::AdamWOptions&>(b.param_groups()[2].options()).lr(1e-2);
        for (size_t k = 0; k < segments.size(); ++k)
          if (segments[k].group == 2)
            static_cast<torch::optim::AdamWOptions&>(reference[k]->param_groups()[0].options())
                .lr(1e-2);
      }
      at::Tensor grad = torch::randn({1037});
      for (size_t k = 0; k < segments.size(); ++k) {
        pieces[k].mutable_grad() = grad.narrow(0, segments[k].begin, segments[k].numel).clone();
        reference[k]->step();
      }
      auto r = b.prepare_step(ranged);
      for (auto [begin, n] : {std::pair<int64_t, int64_t>{500, 537}, {0, 17}, {17, 483}})
        r.run(grad.data_ptr<float>() + begin, begin, n);
    }
    SCOPED_TRACE(half ? "bf16 copy" : "fp32");
    EXPECT_TRUE(torch::equal(torch::cat(pieces), ranged));
    if (half) EXPECT_TRUE(torch::equal(torch::cat(pieces16), ranged16));
    EXPECT_TRUE(torch::equal(ranged.narrow(0, 100, 3), start.narrow(0, 100, 3)));  // lr 0
    std::vector<at::Tensor> m, v;
    for (size_t k = 0; k < segments.size(); ++k) {
      m.push_back(state_of(*reference[k], pieces[k]).exp_avg());
      v.push_back(state_of(*reference[k], pieces[k]).exp_avg_sq());
    }
    EXPECT_TRUE(torch::equal(torch::cat(m), state_of(b, ranged).exp_avg()));
    EXPECT_TRUE(torch::equal(torch::cat(v), state_of(b, ranged).exp_avg_sq()));
  }
}

TEST(StepWorker, RunsTasksInOrderAndRethrowsTheFirstError) {
  deepspeed::offload::StepWorker worker;
  std::vector<int> order;
  for (int i = 0; i < 50; ++i) worker.post([&order, i] { order.push_back(i); });
  worker.wait();
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[i], i);

  std::atomic<int> after{0};
  worker.post([] { throw std::runtime_error("first"); });
  worker.post([] { throw std::runtime_error("second"); });
  worker.post([&after] { ++after; });
  try {
    worker.wait();
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "first");
  }
  EXPECT_EQ(after.load(), 0);  // dropped with the failed step
  worker.post([&after] { ++after; });
  worker.wait();  // usable again
  EXPECT_EQ(after.load(), 1);
}

// Outside the anonymous namespace: AfterBoundaryBackward holds one (this file's namespace keeps
// it apart in a unity batch; -Wsubobject-linkage).
struct Net {
  std::vector<at::Tensor> params;
  explicit Net(at::ScalarType dtype) {
    torch::manual_seed(11);
    for (auto shape : {std::vector<int64_t>{24, 16}, {24}, {24, 24}, {24}, {5, 24}, {5}})
      params.push_back((torch::randn(shape) * 0.3).to(dtype).requires_grad_());
  }
  at::Tensor loss(int step) {
    torch::manual_seed(100 + step);
    at::Tensor x = torch::randn({8, 16}).to(params[0].scalar_type());
    x = torch::tanh(torch::linear(x, params[0], params[1]));
    x = torch::tanh(torch::linear(x, params[2], params[3]));
    return torch::linear(x, params[4], params[5]).to(torch::kFloat).pow(2).mean();
  }
};

namespace {

std::shared_ptr<torch::optim::Optimizer> adam(std::vector<at::Tensor> params) {
  return std::make_shared<deepspeed::optim::FusedAdam>(std::move(params),
                                                       dstest::decaying_adam_hyper());
}

FlatStageOptions offload_options(bool scatter, at::ScalarType dtype, bool overlap_step,
                                 bool allowed = true) {
  FlatStageOptions o;
  o.param_dtype = dtype;
  o.scatter_gradients = scatter;
  o.reduction.bucket_numel = 200;  // several buckets
  o.reduction.overlap = true;
  o.shard.home = OffloadDevice::kCpu;
  o.shard.overlap_step_allowed = allowed;
  o.shard.overlap_step = overlap_step;
  return o;
}

struct Trained {
  std::vector<at::Tensor> params;
  at::Tensor exp_avg;
  size_t ranges = 0;
  bool changed_before_step = false;
};

// `allowed` false: the step scales the gradients by `scale` (as clipping does), so ranges are
// only taken during backward and updated at the step; the first step is discarded (as an fp16
// overflow does).
Trained train(bool scatter, at::ScalarType dtype, bool overlap_step, bool allowed = true,
              double scale = 1.0) {
  Net net(dtype);
  StageContext ctx{deepspeed::comm::make_single_process_communicator(), torch::kCPU};
  FlatStage stage(net.params, ctx, offload_options(scatter, dtype, overlap_step, allowed), adam);
  Trained t;
  if (!allowed) {
    stage.begin_backward(true);
    net.loss(99).backward();
    stage.end_backward(true);
    stage.discard_gradients();
  }
  for (int step = 0; step < 3; ++step) {
    at::Tensor before = stage.flat().buffer().clone();
    stage.begin_backward(true);
    net.loss(step).backward();
    stage.end_backward(true);
    // The worker updates the buffer without step(): wait for it to show (at most 20 s).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (overlap_step && allowed && !t.changed_before_step &&
           std::chrono::steady_clock::now() < deadline) {
      t.changed_before_step = !torch::equal(before, stage.flat().buffer());
      if (!t.changed_before_step) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (!allowed) t.changed_before_step = !torch::equal(before, stage.flat().buffer());
    stage.step(scale);
    t.ranges = stage.ranges_stepped_during_backward();
  }
  for (auto& p : net.params) t.params.push_back(p.detach().clone());
  const auto& master = stage.optimizer()->param_groups()[0].params()[0];
  t.exp_avg = state_of(*stage.optimizer(), master).exp_avg().clone();
  EXPECT_EQ(state_of(*stage.optimizer(), master).step(), 3);
  return t;
}

}  // namespace

class StepDuringBackward : public ::testing::TestWithParam<std::tuple<bool, at::ScalarType>> {};

TEST_P(StepDuringBackward, UpdatesBeforeTheStepAndMatchesTheSerialStep) {
  auto [scatter, dtype] = GetParam();
  Trained overlapped = train(scatter, dtype, true);
  Trained serial = train(scatter, dtype, false);
  EXPECT_TRUE(overlapped.changed_before_step) << "nothing was updated before step()";
  EXPECT_GE(overlapped.ranges, 2u) << "the buckets were not updated one by one";
  EXPECT_EQ(serial.ranges, 0u);
  ASSERT_EQ(overlapped.params.size(), serial.params.size());
  for (size_t i = 0; i < serial.params.size(); ++i)
    EXPECT_TRUE(torch::equal(overlapped.params[i], serial.params[i])) << "parameter " << i;
  EXPECT_TRUE(torch::equal(overlapped.exp_avg, serial.exp_avg));
}

// A single rank reduces nothing, so with the update during backward its buckets are cut finer
// than reduce_bucket_size (at most 1/32 of the buffer, at least 2^16 elements): with DeepSpeed's
// usual 5e8, one bucket would leave the whole update after backward. Two weights of 131k elements
// and their biases (backward order: bias, weight, bias, weight): four buckets, each weight (past
// the 2^16 cap) and each bias alone.
TEST(StepDuringBackwardBuckets, OneRankCutsItsBucketsFinerThanReduceBucketSize) {
  torch::manual_seed(3);
  std::vector<at::Tensor> params;
  for (auto shape : {std::vector<int64_t>{512, 256}, {512}, {256, 512}, {256}})
    params.push_back((torch::randn(shape) * 0.05).requires_grad_());
  for (bool overlap : {true, false}) {
    StageContext ctx{deepspeed::comm::make_single_process_communicator(), torch::kCPU};
    FlatStageOptions o = offload_options(/*scatter=*/true, at::kFloat, overlap);
    o.reduction.bucket_numel = 500000000;
    FlatStage stage(params, ctx, o, adam);
    stage.begin_backward(true);
    at::Tensor x = torch::tanh(torch::linear(torch::randn({4, 256}), params[0], params[1]));
    torch::linear(x, params[2], params[3]).pow(2).mean().backward();
    stage.end_backward(true);
    stage.step(1.0);
    if (overlap)
      EXPECT_EQ(stage.ranges_stepped_during_backward(), 4u) << "buckets of reduce_bucket_size";
    else
      EXPECT_EQ(stage.ranges_stepped_during_backward(), 0u);
  }
}

// Stages 0/1 all-reduce in place and used to finish every bucket at the end of backward, so their
// update could start only there. With the update during backward they finish as they go: four
// layers of 256 x 256 make eight buckets (a weight fills the 2^16 cap at world size 1, so each
// bias is a bucket of its own); when the first layer's
// gradient arrives, the last layer's bucket has been finished and its update has changed the
// buffer, before backward is over.
TEST(StepDuringBackwardBuckets, AllReduceBucketsAreUpdatedBeforeBackwardEnds) {
  torch::manual_seed(5);
  std::vector<at::Tensor> params;
  for (int layer = 0; layer < 4; ++layer) {
    params.push_back((torch::randn({256, 256}) * 0.05).requires_grad_());
    params.push_back(torch::zeros({256}).requires_grad_());
  }
  StageContext ctx{deepspeed::comm::make_single_process_communicator(), torch::kCPU};
  FlatStageOptions o = offload_options(/*scatter=*/false, at::kFloat, true);
  o.reduction.bucket_numel = 500000000;
  FlatStage stage(params, ctx, o, adam);
  const at::Tensor before = stage.flat().buffer().clone();
  bool changed_inside_backward = false;
  params[0].register_hook([&](const at::Tensor& grad) {  // the last gradient backward produces
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!changed_inside_backward && std::chrono::steady_clock::now() < deadline) {
      changed_inside_backward = !torch::equal(before, stage.flat().buffer());
      if (!changed_inside_backward) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return grad;
  });
  stage.begin_backward(true);
  at::Tensor x = torch::randn({4, 256});
  for (int layer = 0; layer < 4; ++layer)
    x = torch::tanh(torch::linear(x, params[2 * layer], params[2 * layer + 1]));
  x.pow(2).mean().backward();
  stage.end_backward(true);
  stage.step(1.0);
  EXPECT_TRUE(changed_inside_backward) << "no bucket was updated before the end of backward";
  EXPECT_EQ(stage.ranges_stepped_during_backward(), 8u);
}

// Clipping or fp16: overlap_step only brings the ranges down during backward; the step updates
// them with its scale, and a discarded step (overflow) leaves nothing behind.
TEST_P(StepDuringBackward, WithAScaledStepTakesRangesAndUpdatesAtTheStep) {
  auto [scatter, dtype] = GetParam();
  Trained overlapped = train(scatter, dtype, true, /*allowed=*/false, 0.5);
  Trained serial = train(scatter, dtype, false, /*allowed=*/false, 0.5);
  EXPECT_FALSE(overlapped.changed_before_step) << "updated before the scale was known";
  EXPECT_GE(overlapped.ranges, 2u);
  for (size_t i = 0; i < serial.params.size(); ++i)
    EXPECT_TRUE(torch::equal(overlapped.params[i], serial.params[i])) << "parameter " << i;
  EXPECT_TRUE(torch::equal(overlapped.exp_avg, serial.exp_avg));
}

INSTANTIATE_TEST_SUITE_P(
    Stages, StepDuringBackward,
    ::testing::Combine(::testing::Bool(), ::testing::Values(at::kFloat, at::kBFloat16)),
    [](const auto& info) {
      return std::string(std::get<0>(info.param) ? "stage2" : "stage1") +
             (std::get<1>(info.param) == at::kFloat ? "_fp32" : "_bf16");
    });

// Stage 2 with overlap_step after a boundary's backward, which updated its ranges: no step yet.
struct AfterBoundaryBackward {
  Net net{at::kFloat};
  StageContext ctx{deepspeed::comm::make_single_process_communicator(), torch::kCPU};
  FlatStage stage{net.params, ctx, offload_options(true, at::kFloat, true), adam};
  AfterBoundaryBackward() {
    stage.begin_backward(true);
    net.loss(0).backward();
    stage.end_backward(true);
  }
};

// A step that would scale the gradients cannot follow an update that already ran unscaled.
TEST(StepDuringBackwardErrors, AGradScaleAfterTheUpdateIsRefused) {
  AfterBoundaryBackward run;
  try {
    run.stage.step(0.5);
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("overlap_step"), std::string::npos) << e.what();
  }
}

// A boundary's backward that updated ranges and was not followed by a step leaves the optimizer
// partly stepped: the next backward says so, whether or not it ends an accumulation (the update
// thread must not run on into a new micro-step).
TEST(StepDuringBackwardErrors, ABackwardAfterAPartlyDoneStepIsRefused) {
  for (bool next_is_boundary : {false, true}) {
    AfterBoundaryBackward run;
    try {
      run.stage.begin_backward(next_is_boundary);
      FAIL() << "no error; boundary " << next_is_boundary;
    } catch (const deepspeed::Error& e) {
      EXPECT_NE(std::string(e.what()).find("partly stepped"), std::string::npos) << e.what();
    }
  }
}

// Dropping a step whose ranges were already updated (a pipeline batch that failed after its
// boundary backward) cannot undo them: the step is abandoned (the update stops before the
// gradients are zeroed under it) and lost, so step() refuses it until a load.
TEST(StepDuringBackwardErrors, DroppingAStepAlreadyUpdatedLosesIt) {
  AfterBoundaryBackward run;
  run.stage.discard_gradients();  // no throw: the gradients are dropped
  EXPECT_TRUE(run.stage.step_lost());
  EXPECT_FALSE(run.stage.update_begun_during_backward()) << "the update still runs";
  try {
    run.stage.step(1.0);
    FAIL() << "a lost step was stepped";
  } catch (const deepspeed::Error& e) {
    EXPECT_NE(std::string(e.what()).find("partly stepped"), std::string::npos) << e.what();
  }
}

// The config decides whether the update may run during backward: not when the step would scale
// the gradients (gradient_clipping, fp16's loss scale) or may be skipped (the overflow vote of
// fp16 or bf16.check_grad_overflow); the key itself is read as written.
TEST(StepDuringBackwardConfig, AllowedOnlyWhenTheStepNeedsNoWholeGradient) {
  auto options = [](nlohmann::json extra) {
    nlohmann::json doc = {{"train_micro_batch_size_per_gpu", 1},
                          {"zero_optimization",
                           {{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}}}}}};
    doc.merge_patch(extra);
    return deepspeed::zero::shard_options(deepspeed::parse_config(doc, 1));
  };
  auto plain = options({{"bf16", {{"enabled", true}}}});
  EXPECT_TRUE(plain.overlap_step_allowed);
  EXPECT_FALSE(plain.overlap_step.has_value());
  EXPECT_FALSE(options({{"gradient_clipping", 1.0}}).overlap_step_allowed);
  EXPECT_FALSE(options({{"fp16", {{"enabled", true}}}}).overlap_step_allowed);
  // A step that may be skipped on an overflow must not have updated during backward.
  EXPECT_FALSE(options({{"bf16", {{"enabled", true}, {"check_grad_overflow", true}}}})
                   .overlap_step_allowed);
  // Stages 1 (reduce-scattering, as stage 2), 2 and 3 overlap with pageable buffers too (their
  // copies are staged): no warning from the config. A stage 1 that all-reduces (a pipeline, a
  // wider accumulation) is warned about at initialize (dist.config_ranks_test).
  const auto warned = [](int stage) {
    std::vector<std::string> warnings;
    deepspeed::parse_config(
        {{"train_micro_batch_size_per_gpu", 1},
         {"zero_optimization",
          {{"stage", stage}, {"offload_optimizer", {{"device", "cpu"}, {"overlap_step", true}}}}}},
        1, {}, &warnings);
    bool named = false;
    for (const auto& w : warnings)
      named = named || w.find("overlap_step is true but pin_memory") != std::string::npos;
    return named;
  };
  EXPECT_FALSE(warned(1));
  EXPECT_FALSE(warned(2));
  EXPECT_FALSE(warned(3));
  auto off = options({{"zero_optimization", {{"offload_optimizer", {{"overlap_step", false}}}}}});
  ASSERT_TRUE(off.overlap_step.has_value());
  EXPECT_FALSE(*off.overlap_step);
  try {
    options({{"zero_optimization", {{"offload_optimizer", {{"overlap_step", "yes"}}}}}});
    FAIL() << "no error";
  } catch (const deepspeed::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("offload_optimizer.overlap_step"), std::string::npos)
        << e.what();
  }
}

// The upload path (the partition not in host memory: a GPU's), run on the CPU with synchronous
// copies: 16-bit gradients widened chunk by chunk, the 16-bit results through a ring of two
// slots reused many times, ranges out of order and a gap left for finish(); also the serial use
// (the whole partition taken at step time with a grad scale). Bit for bit FusedAdam's step.
TEST(StepDuringBackwardUpload, ChunksAndRingGiveTheWholeStep) {
  using deepspeed::zero::StepDuringBackward;
  for (auto [dtype, pin] : {std::pair{at::kBFloat16, false}, std::pair{at::kFloat, false},
                            std::pair{at::kFloat, true}}) {
    for (bool serial : {false, true}) {
      torch::manual_seed(5);
      const int64_t n = 1003;
      at::Tensor start = torch::randn({n});
      at::Tensor master = start.clone(), reference = start.clone();
      at::Tensor partition = start.to(dtype), reference16 = start.to(dtype);
      deepspeed::optim::FusedAdam adam({master}, dstest::decaying_adam_hyper()),
          whole({reference}, dstest::decaying_adam_hyper());
      if (dtype != at::kFloat) whole.set_half_copy(reference, reference16);
      StepDuringBackward::Options o;
      o.upload = true;
      o.pin = pin;  // fp32: the masters page-locked go up as they are, else through the ring
      o.chunk = 37;  // many chunks per range
      o.ring_slots = 2;
      StepDuringBackward host(adam, master, torch::kCPU, o);
      for (int step = 0; step < 3; ++step) {
        at::Tensor grads = torch::randn({n}).to(dtype);  // the gradient partition's dtype
        const float scale = serial ? 0.25f : 1.0f;
        reference.mutable_grad() = grads.to(at::kFloat);
        whole.set_grad_scale(scale);
        whole.step();
        if (serial) {
          adam.set_grad_scale(scale);
          host.take(0, grads, partition);
        } else {
          host.take(600, grads.narrow(0, 600, 403), partition);
          host.take(0, grads.narrow(0, 0, 250), partition);  // [250, 600) is left to finish()
        }
        host.finish(grads, partition);
        EXPECT_EQ(host.ranges_in_last_step(), serial ? 1u : 2u);
      }
      SCOPED_TRACE(std::string(serial ? "serial " : "ranges ") + c10::toString(dtype) +
                   (pin ? " pinned" : ""));
      EXPECT_TRUE(torch::equal(master, reference));
      EXPECT_TRUE(torch::equal(partition, dtype == at::kFloat ? reference : reference16));
      EXPECT_TRUE(torch::equal(state_of(adam, master).exp_avg_sq(),
                               state_of(whole, reference).exp_avg_sq()));
      // 16-bit: the fp32 scratch and the ring; fp32: the ring unless the masters are page-locked.
      const int64_t bytes = dtype == at::kFloat ? (pin ? 0 : 2 * 37 * 4) : 37 * 4 + 2 * 37 * 2;
      EXPECT_EQ(host.host_bytes(), bytes);
    }
  }
}

// Uploading during a GPU's backward, the Adam leaves one core to the kernel-launching thread;
// once the engine reaches finish() backward is launched, and what finish() updates itself (here
// the range no take() covered) runs with the whole team.
TEST(StepDuringBackwardUpload, FinishUpdatesWithTheWholeTeam) {
  using deepspeed::zero::StepDuringBackward;
  const int before = at::get_num_threads();
  at::set_num_threads(3);
  {
    const int64_t n = 400;
    at::Tensor master = torch::randn({n});
    at::Tensor partition = master.to(at::kBFloat16);
    deepspeed::optim::FusedAdam adam({master}, dstest::decaying_adam_hyper());
    StepDuringBackward::Options o;
    o.upload = true;
    o.chunk = 50;
    StepDuringBackward host(adam, master, torch::kCPU, o);
    at::Tensor grads = torch::randn({n}).to(at::kBFloat16);
    host.take(0, grads.narrow(0, 0, 100), partition);  // [100, 400) is left to finish()
    host.finish(grads, partition);
    EXPECT_EQ(host.last_chunk_team(), 3);
  }
  at::set_num_threads(before);
}

// A pageable partition's range is final only once the engine's thread has put its copy in (a
// device::HostFence). After a failed backward that copy never comes: abandon() cancels the
// ranges' fences instead of waiting for ever on a worker that waits for them. The range whose
// values came is updated; the cancelled one is not.
TEST(StepDuringBackwardErrors, AbandonDoesNotWaitForValuesThatWillNeverCome) {
  using deepspeed::device::HostFence;
  using deepspeed::zero::StepDuringBackward;
  at::Tensor master = torch::randn({100});
  const at::Tensor start = master.clone();
  deepspeed::optim::FusedAdam adam({master}, dstest::decaying_adam_hyper());
  StepDuringBackward host(adam, master, torch::kCPU, StepDuringBackward::Options{});
  at::Tensor grads = torch::randn({100});
  auto there = std::make_shared<HostFence>(), never = std::make_shared<HostFence>();
  there->signal();
  host.take(0, grads.narrow(0, 0, 50), master, there);
  host.take(50, grads.narrow(0, 50, 50), master, never);  // the worker waits for it
  host.abandon();  // returns (a hang here fails the test at its timeout)
  EXPECT_FALSE(host.started());
  EXPECT_EQ(host.lost(), 2u) << "a range was updated: the step can neither complete nor be undone";
  EXPECT_FALSE(torch::equal(master.narrow(0, 0, 50), start.narrow(0, 0, 50)));
  EXPECT_TRUE(torch::equal(master.narrow(0, 50, 50), start.narrow(0, 50, 50)));

  // The same when the ranges were only taken (clipping, fp16: updated at the step) and the step
  // is dropped: discard() waits for device copies into its landing buffer, not for values that
  // will never come (a pipeline batch that failed after its boundary backward drops them so).
  StepDuringBackward::Options at_step;
  at_step.update_early = false;
  StepDuringBackward taken(adam, master, torch::kCPU, at_step);
  taken.take(0, grads.narrow(0, 0, 50), master, std::make_shared<HostFence>());
  taken.discard();  // returns (a hang here fails the test at its timeout)
  EXPECT_FALSE(taken.started());
}

// A boundary's backward not completed by a step (it threw, or step() was skipped): when its ranges
// were already updated the next boundary says so, naming the key; when they were only taken
// (clipping, fp16) they are dropped and training goes on.
TEST(StepDuringBackwardErrors, AnUncompletedBoundaryIsNamedOrDropped) {
  for (bool allowed : {true, false}) {
    Net net(at::kFloat);
    StageContext ctx{deepspeed::comm::make_single_process_communicator(), torch::kCPU};
    FlatStage stage(net.params, ctx, offload_options(true, at::kFloat, true, allowed), adam);
    stage.begin_backward(true);
    net.loss(0).backward();
    stage.end_backward(true);  // no step
    if (allowed) {
      try {
        stage.begin_backward(true);
        FAIL() << "no error";
      } catch (const deepspeed::Error& e) {
        EXPECT_NE(std::string(e.what()).find("overlap_step"), std::string::npos) << e.what();
      }
    } else {
      stage.begin_backward(true);
    }
    if (allowed) stage.begin_backward(true);  // the state was reset: training can go on
    net.loss(1).backward();
    stage.end_backward(true);
    stage.step(allowed ? 1.0 : 0.5);
    EXPECT_GE(stage.ranges_stepped_during_backward(), 2u);
  }
}

// An out-of-memory for the update's buffers (the fp32 scratch here; on a GPU also the landing
// buffer and the page-locked ring) comes before the step is counted: a take() that throws records
// nothing, a finish() that throws keeps the step for a retry, and the step then completed is the
// one clean step (counted once: bias correction at step 1, not 2).
TEST(StepDuringBackwardErrors, AFailedAllocationLeavesTheStepAsItWas) {
  using deepspeed::zero::StepDuringBackward;
  for (bool early : {true, false}) {
    SCOPED_TRACE(early ? "updated during backward" : "updated at the step");
    const int64_t n = 4096;  // chunks of 1024: a 4 KiB scratch
    torch::manual_seed(9);
    at::Tensor start = torch::randn({n});
    at::Tensor master = start.clone(), reference = start.clone();
    at::Tensor partition = start.to(at::kBFloat16), reference16 = partition.clone();
    deepspeed::optim::FusedAdam adam({master}, dstest::decaying_adam_hyper()),
        whole({reference}, dstest::decaying_adam_hyper());
    adam.set_half_copy(master, partition);
    whole.set_half_copy(reference, reference16);
    at::Tensor grads = torch::randn({n}).to(at::kBFloat16);
    reference.mutable_grad() = grads.to(at::kFloat);
    whole.step();

    StepDuringBackward::Options o;
    o.update_early = early;
    StepDuringBackward host(adam, master, torch::kCPU, o);
    dstest::FailingCpuAllocatorScope failing(2048);
    failing->arm();
    if (early) {
      EXPECT_THROW(host.take(0, grads.narrow(0, 0, n / 2), partition), c10::Error);
      EXPECT_FALSE(host.started());
    } else {
      host.take(0, grads.narrow(0, 0, n / 2), partition);  // only recorded: nothing allocated
      EXPECT_THROW(host.finish(grads, partition), c10::Error);
      EXPECT_TRUE(host.started()) << "the step was dropped instead of kept for a retry";
    }
    failing->disarm();
    EXPECT_EQ(host.lost(), 0u);
    EXPECT_TRUE(torch::equal(master, start)) << "a failed allocation changed the masters";
    if (early) host.take(0, grads.narrow(0, 0, n / 2), partition);
    host.take(n / 2, grads.narrow(0, n / 2, n / 2), partition);
    host.finish(grads, partition);
    EXPECT_TRUE(torch::equal(master, reference));
    EXPECT_TRUE(torch::equal(partition, reference16));
    EXPECT_EQ(state_of(adam, master).step(), 1);
  }
}

}  // namespace step_during_backward_test
