// FakeCommunicator (tests/support): its scripted results, and what it is for: checking from one
// process which collectives a real engine issues, in which order and with which sizes.
#include "support/fake_communicator.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "deepspeed/deepspeed.h"
#include "gpt/model.h"

namespace fake_communicator_test {

namespace comm = deepspeed::comm;
using dstest::CallRecord;
using dstest::FakeCommunicator;

namespace {

// Peer r passes `mine` + 10 * r (a world whose ranks differ in a known way).
at::Tensor plus_ten_per_rank(const CallRecord&, int peer, const at::Tensor& mine) {
  return mine + 10 * peer;
}

}  // namespace

TEST(FakeCommunicator, ScriptedPeersGiveWhatARealWorldWould) {
  FakeCommunicator c(1, 3, plus_ten_per_rank);  // rank 1 of 3: ranks pass x, x+10, x+20
  at::Tensor t = torch::tensor({1.f, 2.f});
  c.all_reduce(t)->wait();  // rank 1's own tensor is x itself here: x + (x+0) + (x+20)
  EXPECT_TRUE(t.equal(torch::tensor({23.f, 26.f})));

  at::Tensor out = at::empty({6});
  c.all_gather(out, torch::tensor({1.f, 2.f}))->wait();
  EXPECT_TRUE(out.equal(torch::tensor({1.f, 2.f, 1.f, 2.f, 21.f, 22.f})));

  at::Tensor seg = at::empty({1});  // splits 2+1+0: rank 1's segment is element 2
  c.reduce_scatter_v(seg, torch::tensor({0.f, 0.f, 5.f}), {2, 1, 0}, comm::ReduceOp::Avg)->wait();
  EXPECT_TRUE(seg.equal(torch::tensor({(5.f + 5.f + 25.f) / 3})));

  at::Tensor b = torch::tensor({7.f});
  c.broadcast(b, 2)->wait();
  EXPECT_TRUE(b.equal(torch::tensor({27.f})));

  std::vector<std::string> kinds;
  for (auto& call : c.calls()) kinds.push_back(call.kind);
  EXPECT_EQ(kinds, (std::vector<std::string>{"all_reduce", "all_gather", "reduce_scatter_v",
                                             "broadcast"}));
  EXPECT_EQ(c.calls()[2].splits, (std::vector<int64_t>{2, 1, 0}));
  EXPECT_EQ(c.stats().at("all_gather").bytes, 2 * 4);
}

TEST(FakeCommunicator, SplitKeepsThePeersOfTheGroup) {
  // Rank 2 of 4 joins the even ranks {0, 2}; its group peer is world rank 0.
  FakeCommunicator c(2, 4, plus_ten_per_rank,
                     [](int peer, int, int) { return std::make_pair(peer % 2, peer); });
  comm::CommunicatorPtr even = c.split(0, 2);
  ASSERT_TRUE(even);
  EXPECT_EQ(even->world_size(), 2);
  EXPECT_EQ(even->rank(), 1);
  at::Tensor t = torch::tensor({1.f});
  even->all_reduce(t)->wait();
  EXPECT_TRUE(t.equal(torch::tensor({2.f})));  // x (rank 0: x + 0) + x (itself)
  EXPECT_EQ(c.calls().back().kind, "split");
  EXPECT_EQ(c.split(-1, 0), nullptr);
}

// ---- the engine seen through the fake ----

namespace {

const gpt::GPTConfig kModel{64, 8, 2, 2, 16};

nlohmann::json stage0_config() {
  return {{"train_micro_batch_size_per_gpu", 2},
          {"gradient_accumulation_steps", 1},
          {"steps_per_print", 0},
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-2}, {"weight_decay", 0.01}}}}},
          {"zero_optimization",
           {{"stage", 0}, {"reduce_bucket_size", 1500}, {"overlap_comm", false}}}};
}

struct Trained {
  std::vector<double> losses;
  std::vector<at::Tensor> weights;
  std::vector<int64_t> trainable_numels;  // registration order
  int64_t buffers = 0;
};

Trained train(comm::CommunicatorPtr c, int steps) {
  torch::manual_seed(5);
  auto model = std::make_shared<gpt::GPTImpl>(kModel);
  Trained out;
  for (auto& p : model->parameters()) out.trainable_numels.push_back(p.numel());
  out.buffers = static_cast<int64_t>(model->buffers().size());
  auto [engine, optimizer, loader, scheduler] = deepspeed::initialize<gpt::GPTImpl>(
      {.model = model, .config_json = stage0_config(), .comm = c});
  torch::manual_seed(11);
  for (int s = 0; s < steps; ++s) {
    at::Tensor x = torch::randint(kModel.vocab_size, {2, kModel.block_size}, torch::kLong);
    at::Tensor y = torch::randint(kModel.vocab_size, {2, kModel.block_size}, torch::kLong);
    engine->backward(engine->forward(x, y));
    engine->step();
    out.losses.push_back(engine->last_loss());
  }
  for (auto& p : model->parameters()) out.weights.push_back(p.detach().clone());
  return out;
}

// Stage 0's buckets: parameters in reverse registration order (autograd finishes the last
// layers first), a new bucket when the next parameter would take the current one past
// reduce_bucket_size elements (DeepSpeed's cap; a larger parameter is a bucket of its own).
std::vector<int64_t> expected_buckets(const std::vector<int64_t>& numels, int64_t bucket_size) {
  std::vector<int64_t> buckets;
  for (size_t k = numels.size(); k-- > 0;) {
    if (buckets.empty() || buckets.back() + numels[k] > bucket_size) buckets.push_back(0);
    buckets.back() += numels[k];
  }
  return buckets;
}

}  // namespace

// Rank 0 of a world of 2 whose peer mirrors it: the engine must issue the weight broadcasts,
// then per step one fp32 all-reduce per gradient bucket, in bucket order and covering every
// trainable element once, then the loss all-reduce; and averaging over the 2 identical ranks
// must give exactly the single-process result (divide by the world size once, not twice or
// never).
TEST(FakeCommunicator, Stage0EngineIssuesBucketedAllReducesAndAveragesOnce) {
  auto fake = std::make_shared<FakeCommunicator>(0, 2);
  const int steps = 3;
  const Trained two = train(fake, steps);
  const Trained one = train(comm::make_single_process_communicator(), steps);

  EXPECT_EQ(two.losses, one.losses);
  ASSERT_EQ(two.weights.size(), one.weights.size());
  for (size_t i = 0; i < one.weights.size(); ++i)
    EXPECT_TRUE(two.weights[i].equal(one.weights[i])) << "parameter " << i;

  const std::vector<CallRecord> calls = fake->calls();
  const size_t n_params = two.trainable_numels.size();
  const size_t n_init = n_params + static_cast<size_t>(two.buffers);
  ASSERT_GE(calls.size(), n_init);
  for (size_t i = 0; i < n_init; ++i) {
    EXPECT_EQ(calls[i].kind, "broadcast") << "call " << i;
    EXPECT_EQ(calls[i].peer, 0) << "call " << i;
  }
  const std::vector<int64_t> buckets = expected_buckets(two.trainable_numels, 1500);
  ASSERT_GT(buckets.size(), 2u);  // the test model really spans several buckets
  ASSERT_EQ(calls.size(), n_init + steps * (buckets.size() + 1));
  int64_t total = 0;
  for (int64_t n : two.trainable_numels) total += n;
  for (int s = 0; s < steps; ++s) {
    size_t at = n_init + s * (buckets.size() + 1);
    int64_t reduced = 0;
    for (size_t b = 0; b < buckets.size(); ++b, ++at) {
      EXPECT_EQ(calls[at].kind, "all_reduce") << "step " << s << " bucket " << b;
      EXPECT_EQ(calls[at].dtype, at::kFloat);
      EXPECT_EQ(calls[at].numel, buckets[b]) << "step " << s << " bucket " << b;
      reduced += calls[at].numel;
    }
    EXPECT_EQ(reduced, total);
    EXPECT_EQ(calls[at].kind, "all_reduce");  // the mean loss, one double
    EXPECT_EQ(calls[at].dtype, at::kDouble);
    EXPECT_EQ(calls[at].numel, 1);
  }
}

}  // namespace fake_communicator_test
