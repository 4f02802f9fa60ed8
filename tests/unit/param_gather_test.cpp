// The all-gather of the updated partitions at stages 1 and 2 (zero/param_gather.h), on a scripted
// world of two: launched chunks reach the buffer only where they are settled, in the order the
// forward reads them, and waiting launches nothing; with zero_optimization.overlap_param_gather a
// flat stage leaves its gather running into the next forward, whose root and units each settle
// their own chunks, and trains as the stage that waits for the whole gather.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <string>
#include <vector>

#include "deepspeed/config.h"
#include "deepspeed/errors.h"
#include "deepspeed/zero_unit.h"
#include "optim/fused_adam.h"
#include "support/fake_communicator.h"
#include "support/flat_stage_steps.h"
#include "zero/flat_stage.h"
#include "zero/param_gather.h"

namespace param_gather_test {

namespace {

using deepspeed::zero::FlatParams;
using deepspeed::zero::ParamGather;
using deepspeed::zero::StageContext;

// Rank 0 of two; rank 1 passes this rank's tensor plus 1000.
std::shared_ptr<dstest::FakeCommunicator> two_ranks() {
  return std::make_shared<dstest::FakeCommunicator>(
      0, 2, [](const dstest::CallRecord&, int peer, const at::Tensor& mine) {
        return mine + 1000.0 * peer;
      });
}

// 600 parameter elements over two partitions of 304 (padded); the buffer counts 0, 1, 2, ...
struct Buffer {
  std::vector<at::Tensor> params;
  std::unique_ptr<FlatParams> flat;
  Buffer() {
    for (int64_t n : {300, 200, 100}) params.push_back(torch::zeros({n}).requires_grad_());
    flat = std::make_unique<FlatParams>(params, 2, /*alignment=*/16, torch::kCPU);
    flat->buffer().copy_(torch::arange(flat->buffer().numel(), torch::kFloat));
  }
  int64_t P() const { return flat->layout().partition_numel; }
  float at(int64_t i) const { return flat->buffer()[i].item<float>(); }
};

int64_t gathers(const dstest::FakeCommunicator& comm) {
  int64_t n = 0;
  for (const auto& c : comm.calls()) n += c.kind == "all_gather";
  return n;
}

}  // namespace

TEST(ParamGather, LaunchedChunksReachTheBufferOnlyWhereSettled) {
  Buffer b;
  ASSERT_EQ(b.P(), 304);
  auto comm = two_ranks();
  ParamGather gather(StageContext{comm, torch::kCPU}, *b.flat, 0, /*chunk_numel=*/50);
  gather.launch();
  EXPECT_EQ(gathers(*comm), 7);  // 304 / 50, rounded up
  EXPECT_EQ(gather.launched_chunks(), 7u);
  EXPECT_EQ(gather.finished_chunks(), 0u);
  const int64_t peer = b.P();  // where rank 1's partition begins
  EXPECT_EQ(b.at(peer + 303), peer + 303) << "a chunk reached the buffer before it was settled";

  // The end of the partitions first (no forward order given): chunk 6 alone.
  gather.settle(peer + 300, peer + 304);
  EXPECT_EQ(gather.finished_chunks(), 1u);
  EXPECT_EQ(b.at(peer + 300), 300 + 1000) << "rank 1's element is its partition's 300th";
  EXPECT_EQ(b.at(peer + 299), peer + 299) << "settling one chunk finished another";
  EXPECT_EQ(b.at(299), 299) << "the owner's own elements changed";

  gather.settle(peer + 0, peer + 1);  // chunk 0: launched last
  EXPECT_FALSE(gather.in_flight());
  EXPECT_EQ(gathers(*comm), 7) << "waiting launched a collective";
  for (int64_t i = 0; i < b.P(); ++i) {
    ASSERT_EQ(b.at(i), i);
    ASSERT_EQ(b.at(peer + i), i + 1000);
  }
}

TEST(ParamGather, LaunchedAndSettledEqualsGatheredAtOnce) {
  Buffer launched, waited;
  auto comm = two_ranks();
  ParamGather overlapped(StageContext{comm, torch::kCPU}, *launched.flat, 0, 50);
  overlapped.launch();
  overlapped.complete_step();
  ParamGather at_once(StageContext{two_ranks(), torch::kCPU}, *waited.flat, 0, 50);
  at_once.gather();
  EXPECT_TRUE(torch::equal(launched.flat->buffer(), waited.flat->buffer()));
  // One chunk spanning the partition is gathered in place.
  Buffer whole;
  ParamGather in_place(StageContext{two_ranks(), torch::kCPU}, *whole.flat, 0, 1 << 20);
  in_place.gather();
  EXPECT_TRUE(torch::equal(whole.flat->buffer(), waited.flat->buffer()));
}

TEST(ParamGather, ChunksGoInTheOrderTheForwardReadsThem) {
  Buffer b;
  ParamGather gather(StageContext{two_ranks(), torch::kCPU}, *b.flat, 0, 50);
  // The forward reads elements [120, 130) of rank 1's partition first (chunk 2), then the rest.
  const int64_t peer = b.P();
  gather.set_forward_order([&](int64_t begin, int64_t end) {
    return begin < peer + 130 && peer + 120 < end ? int64_t{0} : int64_t{5};
  });
  gather.launch();
  gather.settle(peer + 120, peer + 130);
  EXPECT_EQ(gather.finished_chunks(), 1u) << "the soonest read chunk was not launched first";
  EXPECT_EQ(b.at(peer + 125), 125 + 1000);
  EXPECT_EQ(b.at(peer + 303), peer + 303);
  // Ties: largest offset first.
  gather.settle(peer + 300, peer + 301);
  EXPECT_EQ(gather.finished_chunks(), 2u);
}

namespace {

struct BlockImpl : torch::nn::Module {
  at::Tensor w;
  explicit BlockImpl(int64_t d) { w = register_parameter("w", torch::randn({d, d}) * 0.3); }
  at::Tensor forward(const at::Tensor& x) { return torch::tanh(torch::linear(x, w)); }
};
TORCH_MODULE(Block);

// Root parameters (an input projection, read first, and a head, read last) around four units.
struct NetImpl : torch::nn::Module {
  at::Tensor in, head;
  std::vector<std::shared_ptr<deepspeed::ZeroUnit<Block>>> blocks;
  NetImpl() {
    torch::manual_seed(5);
    in = register_parameter("in", torch::randn({16, 24}) * 0.3);
    for (int i = 0; i < 4; ++i)
      blocks.push_back(register_module("block" + std::to_string(i),
                                       std::make_shared<deepspeed::ZeroUnit<Block>>(Block(24))));
    head = register_parameter("head", torch::randn({5, 24}) * 0.3);
  }
  at::Tensor loss(int step) {
    torch::manual_seed(100 + step);
    at::Tensor x = torch::randn({8, 16}).matmul(in);
    for (auto& b : blocks) x = b->forward(x);
    return torch::linear(x, head).pow(2).mean();
  }
};
TORCH_MODULE(Net);

struct Trained {
  std::vector<float> losses;
  std::vector<at::Tensor> params;
  bool handed_over = true;         // after every step()
  bool root_waited_for_all = false;  // before_forward finished every chunk
};

Trained train(bool overlap, bool scatter) {
  Net net;
  deepspeed::zero::FlatStageOptions o;
  o.scatter_gradients = scatter;
  o.allgather_bucket_numel = 120;  // chunks of 60 elements of each partition
  o.overlap_param_gather = overlap;
  auto adam = [](std::vector<at::Tensor> p) {
    deepspeed::AdamHyper h;
    h.lr = 1e-2;
    return std::make_shared<deepspeed::optim::FusedAdam>(std::move(p), h);
  };
  // Rank 1 passes this rank's tensor: its partition's update is this one's, deterministically.
  auto comm = std::make_shared<dstest::FakeCommunicator>(0, 2);
  Trained t;
  {
    deepspeed::zero::FlatStage stage(net->parameters(), StageContext{comm, torch::kCPU}, o, adam,
                                     net.get());
    EXPECT_EQ(stage.overlapped_gather() != nullptr, overlap);
    auto forward = [&](int step) {
      if (overlap && step > 0)
        t.root_waited_for_all = t.root_waited_for_all || !stage.overlapped_gather()->in_flight();
      return net->loss(step);
    };
    dstest::run_flat_stage_steps(stage, 4, forward, [&](int, const at::Tensor& loss) {
      t.losses.push_back(loss.item<float>());
      t.handed_over = t.handed_over && stage.step_handed_over();
    });
    stage.complete_step();
    EXPECT_FALSE(stage.step_handed_over());
    for (auto& p : net->parameters()) t.params.push_back(p.detach().clone());
  }
  EXPECT_EQ(deepspeed::detail::ZeroUnitAccess::hooks(*net->blocks[1]), nullptr)
      << "the stage left its hooks on the units";
  return t;
}

}  // namespace

TEST(OverlapParamGather, EachUnitSettlesItsChunksAndTrainsAsTheWaitingGather) {
  for (bool scatter : {false, true}) {
    SCOPED_TRACE(scatter ? "stage 2" : "stage 1 (all-reducing)");
    const Trained waiting = train(false, scatter);
    const Trained overlapped = train(true, scatter);
    EXPECT_TRUE(overlapped.handed_over) << "step() waited for the whole gather";
    EXPECT_FALSE(overlapped.root_waited_for_all)
        << "the forward's start waited for the units' chunks too";
    ASSERT_EQ(overlapped.losses, waiting.losses);
    ASSERT_EQ(overlapped.params.size(), waiting.params.size());
    for (size_t i = 0; i < waiting.params.size(); ++i)
      EXPECT_TRUE(torch::equal(overlapped.params[i], waiting.params[i])) << "parameter " << i;
  }
}

// The key: a boolean, read at stages 1 and 2, ignored with a warning at 0 and 3.
TEST(OverlapParamGather, TheConfigKeyAppliesToStages1And2) {
  auto parse = [](int stage, const nlohmann::json& value, std::vector<std::string>* warnings) {
    return deepspeed::parse_config(
        {{"train_batch_size", 8},
         {"zero_optimization", {{"stage", stage}, {"overlap_param_gather", value}}}},
        1, {}, warnings);
  };
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    std::vector<std::string> warnings;
    const auto c = parse(stage, true, &warnings);
    const bool applies = stage == 1 || stage == 2;
    EXPECT_EQ(c.zero_optimization.overlap_param_gather, applies);
    const std::string said = "zero_optimization.overlap_param_gather applies to stages 1 and 2; "
                             "ignored at stage " + std::to_string(stage);
    bool warned = false;
    for (const auto& w : warnings) warned = warned || w.find(said) != std::string::npos;
    EXPECT_EQ(warned, !applies);
  }
  EXPECT_FALSE(parse(2, false, nullptr).zero_optimization.overlap_param_gather);
  try {
    parse(2, "maybe", nullptr);
    FAIL() << "a string was taken for a boolean";
  } catch (const deepspeed::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("zero_optimization.overlap_param_gather"),
              std::string::npos) << e.what();
  }
}

}  // namespace param_gather_test
