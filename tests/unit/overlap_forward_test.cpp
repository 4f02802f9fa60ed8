// offload_optimizer.overlap_forward (zero/forward_waits.h), on CPU tensors: the worker's queue
// is put in the next forward's order; StepDuringBackward::hand_over leaves the last ranges
// running, settle() waits for exactly the range asked for, and the update is the whole step bit
// for bit; a flat stage attaches itself to the model's ZeroUnits, hands each step over, and
// trains as the step that waits for its update.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <limits>

#include <torch/torch.h>

#include "deepspeed/comm.h"
#include "deepspeed/zero_unit.h"
#include "device/transfer_stream.h"
#include "offload/step_worker.h"
#include "optim/adamw_state.h"
#include "optim/fused_adam.h"
#include "support/flat_stage_steps.h"
#include "util/torch_compat.h"
#include "zero/flat_stage.h"
#include "zero/forward_waits.h"
#include "zero/stage3/unit_internals.h"
#include "zero/step_during_backward.h"
#include "support/adam_hyper.h"

namespace overlap_forward_test {

using deepspeed::device::HostFence;
using deepspeed::zero::StepDuringBackward;

namespace {

torch::optim::AdamWParamState& state_of(torch::optim::Optimizer& o, const at::Tensor& p) {
  return static_cast<torch::optim::AdamWParamState&>(
      *o.state().at(deepspeed::compat::optimizer_state_key(p)));
}

bool descending(int64_t a, int64_t b) { return a > b; }

// The order a forward would read ranges in, for hand_over: all at once (the ties go highest first).
int64_t all_at_once(int64_t, int64_t) { return 0; }

}  // namespace

TEST(StepWorkerOrder, ReorderPutsTheQueuedTasksInTheGivenOrder) {
  deepspeed::offload::StepWorker worker;
  std::promise<void> go;
  std::shared_future<void> released = go.get_future().share();
  std::vector<int64_t> order;  // written by the worker only, read after wait()
  worker.post([released] { released.wait(); }, -1);
  for (int64_t k = 1; k <= 5; ++k) worker.post([&order, k] { order.push_back(k); }, k);
  worker.reorder(descending);
  go.set_value();
  worker.wait();
  EXPECT_EQ(order, (std::vector<int64_t>{5, 4, 3, 2, 1}));
}

// The worker is held on the first range's values ([600, 1000)); [0, 250) waits for values still
// held back; hand_over queues what no range covered ([250, 600)) and, as the next forward reads
// it first, moves it ahead of [0, 250).
// Released, the worker does [600, 1000) and [250, 600), and settle(250, 600) returns while
// [0, 250) is still waiting: in the taken order it would wait behind it. settle(0, 250) then
// waits until those values come. The result is the whole step's, bit for bit.
TEST(HandOver, TheRestRunsInTheGivenOrderAndSettleWaitsForItsRangeOnly) {
  const int64_t n = 1000;
  torch::manual_seed(7);
  const at::Tensor start = torch::randn({n});
  at::Tensor master = start.clone(), reference = start.clone();
  at::Tensor partition = start.to(at::kBFloat16), reference16 = partition.clone();
  const at::Tensor start16 = partition.clone();
  deepspeed::optim::FusedAdam adam({master}, dstest::decaying_adam_hyper()),
      whole({reference}, dstest::decaying_adam_hyper());
  whole.set_half_copy(reference, reference16);
  StepDuringBackward::Options o;
  o.upload = true;  // through the ring, as from a GPU (the copies are the CPU's: synchronous)
  o.chunk = 64;
  StepDuringBackward host(adam, master, torch::kCPU, o);
  const at::Tensor grads = torch::randn({n}).to(at::kBFloat16);
  reference.mutable_grad() = grads.to(at::kFloat);
  whole.step();

  auto first = std::make_shared<HostFence>(), held = std::make_shared<HostFence>();
  host.take(600, grads.narrow(0, 600, 400), partition, first);
  host.take(0, grads.narrow(0, 0, 250), partition, held);
  host.hand_over(grads, partition, [](int64_t begin, int64_t) { return begin == 250 ? 0 : 1; });
  EXPECT_TRUE(host.handed_over());
  EXPECT_EQ(host.ranges_in_last_step(), 2u);
  first->signal();
  auto middle = std::async(std::launch::async, [&] { host.settle(250, 600); });
  if (middle.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    held->signal();
    middle.get();
    FAIL() << "[250, 600) waited behind [0, 250): the queue was not reordered";
  }
  middle.get();
  EXPECT_TRUE(torch::equal(partition.narrow(0, 250, 750), reference16.narrow(0, 250, 750)));
  EXPECT_TRUE(torch::equal(partition.narrow(0, 0, 250), start16.narrow(0, 0, 250)));

  auto low = std::async(std::launch::async, [&] { host.settle(0, 250); });
  EXPECT_EQ(low.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout)
      << "settle(0, 250) returned before its values came";
  held->signal();
  low.get();
  EXPECT_GE(host.ranges_waited_for(), 1u);
  EXPECT_TRUE(torch::equal(partition, reference16));
  host.complete();
  EXPECT_FALSE(host.handed_over());
  EXPECT_FALSE(host.started());
  EXPECT_TRUE(torch::equal(master, reference));
  EXPECT_TRUE(torch::equal(state_of(adam, master).exp_avg_sq(),
                           state_of(whole, reference).exp_avg_sq()));
}

// A range of the next step before the handed-over one is complete is a bug upstream (the stage
// completes it at begin_backward): refused. abandon() (a failed backward's clean-up) completes a
// handed-over step rather than losing it: its gradients were final.
TEST(HandOver, TheNextStepWaitsForCompleteAndAbandonCompletes) {
  const int64_t n = 300;
  torch::manual_seed(9);
  at::Tensor master = torch::randn({n}), reference = master.clone();
  deepspeed::optim::FusedAdam adam({master}, dstest::decaying_adam_hyper()),
      whole({reference}, dstest::decaying_adam_hyper());
  StepDuringBackward host(adam, master, torch::kCPU, StepDuringBackward::Options{});
  const at::Tensor grads = torch::randn({n});
  reference.mutable_grad() = grads.clone();
  whole.step();
  host.take(0, grads.narrow(0, 0, 100), master);
  host.hand_over(grads, master, all_at_once);
  EXPECT_THROW(host.take(0, grads.narrow(0, 0, 100), master), c10::Error);
  host.abandon();
  EXPECT_FALSE(host.handed_over());
  EXPECT_EQ(host.lost(), 0u);
  EXPECT_TRUE(torch::equal(master, reference));
}

// A range whose values never come (its fence cancelled: a failed backward's copy) fails the
// worker: settle() throws instead of waiting for ever, and the step is lost, naming the hand-over.
TEST(HandOver, AFailedRangeIsThrownBySettleNotWaitedForEver) {
  const int64_t n = 200;
  at::Tensor master = torch::randn({n});
  deepspeed::optim::FusedAdam adam({master}, dstest::decaying_adam_hyper());
  StepDuringBackward host(adam, master, torch::kCPU, StepDuringBackward::Options{});
  const at::Tensor grads = torch::randn({n});
  auto never = std::make_shared<HostFence>();
  host.take(100, grads.narrow(0, 100, 100), master, never);
  host.hand_over(grads, master, all_at_once);
  never->cancel();
  auto waiting = std::async(std::launch::async, [&] { host.settle(0, n); });
  ASSERT_EQ(waiting.wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "settle() waits for a range that will never be updated";
  EXPECT_ANY_THROW(waiting.get());
  EXPECT_GT(host.lost(), 0u);
  EXPECT_TRUE(host.lost_in_forward());
  EXPECT_FALSE(host.handed_over());
}

namespace {

struct BlockImpl : torch::nn::Module {
  at::Tensor w, b;
  explicit BlockImpl(int64_t d) {
    w = register_parameter("w", torch::randn({d, d}) * 0.3);
    b = register_parameter("b", torch::randn({d}) * 0.1);
  }
  // (The scaling leaves an output that autograd saves nothing of: it may be changed in place.)
  at::Tensor forward(const at::Tensor& x) { return torch::tanh(torch::linear(x, w, b)) * 0.9; }
};
TORCH_MODULE(Block);

// Root parameters (an input projection and a head) around three units.
struct NetImpl : torch::nn::Module {
  at::Tensor in, head;
  std::vector<std::shared_ptr<deepspeed::ZeroUnit<Block>>> blocks;
  explicit NetImpl(at::ScalarType dtype) {
    torch::manual_seed(11);
    in = register_parameter("in", torch::randn({16, 24}) * 0.3);
    for (int i = 0; i < 3; ++i)
      blocks.push_back(register_module("block" + std::to_string(i),
                                       std::make_shared<deepspeed::ZeroUnit<Block>>(Block(24))));
    head = register_parameter("head", torch::randn({5, 24}) * 0.3);
    to(dtype);
  }
  bool scale_in_place = false;  // an in-place op on each unit's output
  at::Tensor loss(int step) {
    torch::manual_seed(100 + step);
    at::Tensor x = torch::randn({8, 16}).to(in.scalar_type()).matmul(in);
    for (auto& b : blocks) {
      x = b->forward(x);
      if (scale_in_place) x.mul_(0.5);
    }
    return torch::linear(x, head).to(torch::kFloat).pow(2).mean();
  }
};
TORCH_MODULE(Net);

struct Trained {
  std::vector<at::Tensor> params;
  at::Tensor exp_avg_sq;
  bool attached = false;
  bool handed_over = true;  // after every step()
};

Trained train(bool overlap_forward, bool scatter, at::ScalarType dtype, bool with_model = true,
              bool scale_in_place = false) {
  Net net(dtype);
  net->scale_in_place = scale_in_place;
  deepspeed::zero::FlatStageOptions o;
  o.param_dtype = dtype;
  o.scatter_gradients = scatter;
  o.reduction.bucket_numel = 200;  // several ranges
  o.shard.home = deepspeed::zero::OffloadDevice::kCpu;
  o.shard.overlap_step_allowed = true;
  o.shard.overlap_step = true;
  o.shard.overlap_forward = overlap_forward;
  deepspeed::zero::StageContext ctx{deepspeed::comm::make_single_process_communicator(),
                                    torch::kCPU};
  auto adam = [](std::vector<at::Tensor> p) {
    return std::make_shared<deepspeed::optim::FusedAdam>(std::move(p),
                                                         dstest::decaying_adam_hyper());
  };
  Trained t;
  {
    deepspeed::zero::FlatStage stage(net->parameters(), ctx, o, adam,
                                     with_model ? net.get() : nullptr);
    t.attached = deepspeed::detail::ZeroUnitAccess::hooks(*net->blocks[1]) != nullptr;
    dstest::run_flat_stage_steps(
        stage, 4, [&](int step) { return net->loss(step); },
        [&](int, const at::Tensor&) { t.handed_over = t.handed_over && stage.step_handed_over(); });
    stage.complete_step();
    EXPECT_FALSE(stage.step_handed_over());
    for (auto& p : net->parameters()) t.params.push_back(p.detach().clone());
    const auto& master = stage.optimizer()->param_groups()[0].params()[0];
    t.exp_avg_sq = state_of(*stage.optimizer(), master).exp_avg_sq().clone();
  }
  EXPECT_EQ(deepspeed::detail::ZeroUnitAccess::hooks(*net->blocks[1]), nullptr)
      << "the stage left its hooks on the units";
  return t;
}

}  // namespace

// What ForwardWaits asks the shard for, recorded: the ranges each part of the model waits for.
class RecordingShard final : public deepspeed::zero::ShardOptimizer {
 public:
  std::vector<std::pair<int64_t, int64_t>> settled;  // (begin, end), in call order
  int completed = 0;
  void settle(int64_t begin, int64_t end) override { settled.emplace_back(begin, end); }
  void complete_step() override { ++completed; }

  void step(const deepspeed::zero::ShardGrads&, deepspeed::zero::ParamPartition&, double) override {}
  std::shared_ptr<torch::optim::Optimizer> optimizer() const override { return nullptr; }
  std::array<at::Tensor, 3> state_for_save() override { return {}; }
  std::array<at::Tensor, 3> state_for_load(bool) override { return {}; }
  std::unique_ptr<deepspeed::zero::StateWindows> windows_for_save() override { return nullptr; }
  std::unique_ptr<deepspeed::zero::StateWindows> windows_for_load(bool) override {
    return nullptr;
  }
  void finish_load(int64_t, deepspeed::zero::ParamPartition&) override {}
  int64_t adam_step() const override { return 0; }
  void refresh_masters(deepspeed::zero::ParamPartition&) override {}
  void masters_edited(deepspeed::zero::ParamPartition&, int64_t, const at::Tensor&) override {}
  int64_t resident_bytes() const override { return 0; }
};

// The ranges a unit waits for are its own parameters' elements in the flat buffer (laid out in
// reverse), the root's are those outside every unit, together they are every parameter once; a
// frozen parameter is in none. Without units a forward waits for the whole update.
TEST(ForwardWaits, EachUnitWaitsForItsOwnParametersBeforeItRuns) {
  Net net(at::kFloat);
  net->blocks[2]->inner()->b.requires_grad_(false);  // frozen: not in the flat buffer
  std::vector<at::Tensor> trainable;
  for (auto& p : net->parameters())
    if (p.requires_grad()) trainable.push_back(p);
  deepspeed::zero::FlatParams flat(trainable, 1, /*alignment=*/64, torch::kCPU);  // padded
  auto range_of = [&](const at::Tensor& p) {
    for (const auto& slot : flat.slots())
      if (slot.param.is_same(p)) return std::make_pair(slot.offset, slot.offset + slot.numel);
    ADD_FAILURE() << "no slot";
    return std::make_pair(int64_t{0}, int64_t{0});
  };
  // Two ranges, adjacent in the buffer, make one wait.
  auto joined = [](std::pair<int64_t, int64_t> a, std::pair<int64_t, int64_t> b) {
    EXPECT_EQ(std::min(a.second, b.second), std::max(a.first, b.first)) << "not adjacent";
    return std::make_pair(std::min(a.first, b.first), std::max(a.second, b.second));
  };
  RecordingShard shard;
  {
    deepspeed::zero::ForwardWaits waits(*net, flat, 0, flat.buffer().numel(), shard, "key");
    EXPECT_EQ(waits.unit_count(), 3u);
    waits.before_forward();
    // parameters() lists a module's own before its children's: `in` and `head` are neighbours.
    ASSERT_EQ(shard.settled.size(), 1u) << "the root: `in` and `head`, one run of the buffer";
    EXPECT_EQ(shard.settled[0], joined(range_of(net->in), range_of(net->head)));
    shard.settled.clear();
    torch::NoGradGuard no_grad;
    net->loss(0);
    ASSERT_EQ(shard.settled.size(), 3u) << "one wait per unit, as it runs";
    for (int u = 0; u < 2; ++u) {
      const auto& inner = net->blocks[u]->inner();
      EXPECT_EQ(shard.settled[u], joined(range_of(inner->w), range_of(inner->b))) << "unit " << u;
    }
    EXPECT_EQ(shard.settled[2], range_of(net->blocks[2]->inner()->w)) << "the frozen bias waits";
    EXPECT_EQ(shard.completed, 0);
    // The update's queue: the root first (read as the forward begins), then unit by unit, the
    // padding last.
    auto first_read = [&](std::pair<int64_t, int64_t> r) { return waits.first_read(r.first, r.second); };
    EXPECT_EQ(first_read(range_of(net->head)), 0);
    EXPECT_EQ(first_read(range_of(net->in)), 0);
    for (int u = 0; u < 3; ++u)
      EXPECT_EQ(first_read(range_of(net->blocks[u]->inner()->w)), u + 1) << "unit " << u;
    const auto w1 = range_of(net->blocks[1]->inner()->w), b0 = range_of(net->blocks[0]->inner()->b);
    EXPECT_EQ(waits.first_read(std::min(w1.first, b0.first), std::max(w1.second, b0.second)), 1)
        << "a range over units 0 and 1 is read with unit 0";
    const int64_t end = flat.buffer().numel();
    ASSERT_LT(range_of(net->in).second, end) << "no padding after the last parameter";
    EXPECT_EQ(waits.first_read(range_of(net->in).second, end), std::numeric_limits<int64_t>::max());
  }
  // A unit's parameter that the root registers too (a tied embedding and head) is the root's to
  // wait for as well: the root may read it before the unit runs.
  {
    Net tied(at::kFloat);
    const at::Tensor shared = tied->blocks[1]->inner()->w;
    tied->register_parameter("tied", shared);
    std::vector<at::Tensor> params;
    for (auto& p : tied->parameters())
      if (std::none_of(params.begin(), params.end(), [&](const at::Tensor& q) { return q.is_same(p); }))
        params.push_back(p);
    deepspeed::zero::FlatParams tied_flat(params, 1, 1, torch::kCPU);
    RecordingShard tied_shard;
    deepspeed::zero::ForwardWaits waits(*tied, tied_flat, 0, tied_flat.buffer().numel(),
                                        tied_shard, "key");
    int64_t begin = -1, end = -1;
    for (const auto& slot : tied_flat.slots())
      if (slot.param.is_same(shared)) begin = slot.offset, end = slot.offset + slot.numel;
    ASSERT_GE(begin, 0);
    EXPECT_EQ(waits.first_read(begin, end), 0);
    waits.before_forward();
    bool settled = false;
    for (const auto& [b, e] : tied_shard.settled) settled = settled || (b <= begin && end <= e);
    EXPECT_TRUE(settled) << "the root's wait leaves out the parameter it shares with unit 1";
  }
  Net plain(at::kFloat);
  plain->blocks.clear();
  deepspeed::zero::FlatParams flat_plain({plain->in, plain->head}, 1, 1, torch::kCPU);
  struct Bare : torch::nn::Module {} bare;
  deepspeed::zero::ForwardWaits no_units(bare, flat_plain, 0, flat_plain.buffer().numel(), shard,
                                         "key");
  no_units.before_forward();
  EXPECT_EQ(shard.completed, 1);
}

class OverlapForward : public ::testing::TestWithParam<std::tuple<bool, at::ScalarType>> {};

TEST_P(OverlapForward, HandsEachStepOverAndTrainsAsTheWaitingStep) {
  auto [scatter, dtype] = GetParam();
  Trained waiting = train(false, scatter, dtype);
  Trained handed = train(true, scatter, dtype);
  Trained no_units = train(true, scatter, dtype, /*with_model=*/false);
  EXPECT_FALSE(waiting.attached);
  EXPECT_FALSE(waiting.handed_over);
  EXPECT_TRUE(handed.attached) << "the units do not wait for their parameters";
  EXPECT_TRUE(handed.handed_over) << "step() waited for the whole update";
  EXPECT_TRUE(no_units.handed_over);
  for (const Trained* t : {&handed, &no_units}) {
    ASSERT_EQ(t->params.size(), waiting.params.size());
    for (size_t i = 0; i < waiting.params.size(); ++i)
      EXPECT_TRUE(torch::equal(t->params[i], waiting.params[i])) << "parameter " << i;
    EXPECT_TRUE(torch::equal(t->exp_avg_sq, waiting.exp_avg_sq));
  }
}

// Unlike stage 3's hooks, these add no identity node to a unit's outputs (their pre_backward does
// nothing): an in-place op on an output trains as without the key, instead of autograd refusing
// to modify a custom Function's output in place.
TEST(OverlapForwardUnits, AnInPlaceOpOnAUnitsOutputTrainsAsWithoutTheKey) {
  Trained waiting = train(false, true, at::kFloat, true, /*scale_in_place=*/true);
  Trained handed = train(true, true, at::kFloat, true, /*scale_in_place=*/true);
  EXPECT_TRUE(handed.attached);
  ASSERT_EQ(handed.params.size(), waiting.params.size());
  for (size_t i = 0; i < waiting.params.size(); ++i)
    EXPECT_TRUE(torch::equal(handed.params[i], waiting.params[i])) << "parameter " << i;
}

INSTANTIATE_TEST_SUITE_P(
    Stages1And2, OverlapForward,
    testing::Combine(testing::Bool(), testing::Values(at::kFloat, at::kBFloat16)),
    [](const auto& info) {
      return std::string(std::get<0>(info.param) ? "Stage2" : "Stage1") +
             (std::get<1>(info.param) == at::kFloat ? "Fp32" : "Bf16");
    });

}  // namespace overlap_forward_test
