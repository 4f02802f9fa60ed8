// A backward that throws midway (here a gradient hook; an out-of-memory does the same) has already
// reduced, or launched the reductions of, the buckets of the layers after the throw. The engine
// goes on: it finishes what was in flight at once (its gradients stay, as PyTorch's .grad keeps
// what a failed backward computed) and gives back what the pass held, then the next backward runs
// as usual, at every reducing stage.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <stdexcept>

#include "deepspeed/deepspeed.h"
#include "support/expect.h"
#include "support/failing_cpu_allocator.h"
#include "support/two_layers.h"
#include "support/ranks.h"
#include "support/stage3_models.h"

namespace failed_backward_test {

namespace {

class FailedBackward : public ::testing::TestWithParam<int> {};

TEST_P(FailedBackward, TrainingGoesOnAfterABackwardThatThrewMidway) {
  const int stage = GetParam();
  auto config = dstest::stage3_test_config(stage);  // buckets of 2000 elements, overlap_comm
  at::set_num_threads(1);
  std::vector<std::shared_ptr<dstest::OuterModelImpl>> models;
  for (int r = 0; r < 2; ++r) {
    torch::manual_seed(11 + r);
    models.push_back(std::make_shared<dstest::OuterModelImpl>());
  }
  std::vector<std::vector<double>> losses(2), forward_losses(2);
  std::mutex mu;
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    const int rank = comm->rank();
    auto& model = models[rank];
    auto engine = deepspeed::initialize<dstest::OuterModelImpl>(
                      {.model = model, .config_json = config, .comm = comm})
                      .engine;
    // The first layer's gradient comes last but for the embedding's: the head's and the later
    // layers' buckets are reduced or in flight when it throws.
    bool fail = false;
    model->named_parameters()["layers.0.fc.weight"].register_hook([&fail](const at::Tensor& g) {
      if (fail) throw std::runtime_error("injected failure in backward");
      return g;
    });
    std::vector<double> mine, forwards;
    for (int64_t micro = 0; micro < 5; ++micro) {
      auto b = dstest::token_batch(rank, micro);
      fail = micro == 1;
      auto loss = engine->forward(b.idx, b.targets);
      if (fail) {
        EXPECT_ANY_THROW(engine->backward(loss));
        // Given back at once, not at the next backward: a retry (a smaller micro-batch after an
        // out-of-memory, say) has the memory.
        if (stage == 3)
          EXPECT_EQ(engine->memory_report().gathered_numel, 0) << "the failed pass's units stay";
        continue;
      }
      forwards.push_back(loss.item<double>());
      engine->backward(loss);
      engine->step();
      mine.push_back(engine->last_loss());
    }
    std::lock_guard<std::mutex> lock(mu);
    losses[rank] = mine;
    forward_losses[rank] = forwards;
  });
  ASSERT_EQ(losses[0].size(), 4u);
  EXPECT_EQ(losses[0], losses[1]) << "the ranks parted";
  for (double l : losses[0]) EXPECT_TRUE(std::isfinite(l));
  EXPECT_LT(losses[0].back(), losses[0].front());
  // Each step's loss is the ranks' mean of its own micro-step: the failed one's is not in it.
  for (size_t i = 0; i < losses[0].size(); ++i)
    EXPECT_NEAR(losses[0][i], (forward_losses[0][i] + forward_losses[1][i]) / 2,
                1e-6 * std::abs(losses[0][i]))
        << "step " << i;
}

using dstest::TwoLayersImpl;

// Stage 0's gradient bucket (at one rank it has none, so this takes two): an out-of-memory while
// it is first allocated names it, training goes on, and once allocated it is kept from one
// backward to the next.
TEST(FailedBackward, StageZerosBucketIsNamedWhenItsAllocationFails) {
  at::set_num_threads(1);
  dstest::FailingCpuAllocatorScope failing(3 << 20);
  nlohmann::json config = {{"train_micro_batch_size_per_gpu", 2},
                           {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}}}}},
                           {"zero_optimization", {{"stage", 0}}}};
  std::vector<std::string> messages(2);
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    torch::manual_seed(3);
    auto model = std::make_shared<TwoLayersImpl>();
    auto engine = deepspeed::initialize<TwoLayersImpl>(
                      {.model = model, .config_json = config, .comm = comm})
                      .engine;
    auto loss = engine->forward(torch::randn({2, 700}));
    comm->barrier();
    if (comm->rank() == 0) failing->arm();
    comm->barrier();
    try {
      engine->backward(loss);
    } catch (const deepspeed::Error& e) {
      messages[comm->rank()] = e.what();
    }
    comm->barrier();
    if (comm->rank() == 0) failing->disarm();
    comm->barrier();
    for (int step = 0; step < 2; ++step) {
      // Once allocated, the bucket serves every later backward: with large allocations failing
      // again, the second step allocates nothing of that size.
      comm->barrier();
      if (comm->rank() == 0 && step == 1) failing->arm();
      comm->barrier();
      engine->backward(engine->forward(torch::randn({2, 700})));
      engine->step();
      comm->barrier();
      if (comm->rank() == 0) failing->disarm();
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_CONTAINS(messages[r], "rank " + std::to_string(r) + "'s backward while allocating a "
                                 "gradient bucket (reduce_bucket_size) (980000 elements, 3.7 MiB)");
    EXPECT_CONTAINS(messages[r], "(zero stage 0)");
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, FailedBackward, ::testing::Values(0, 1, 2, 3),
                         [](const auto& info) { return "stage" + std::to_string(info.param); });

}  // namespace

}  // namespace failed_backward_test
