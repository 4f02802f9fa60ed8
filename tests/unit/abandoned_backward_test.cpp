// ZeroStage::abandon_backward for the flat stages (1: all-reduce at the boundary, 2: reduce-scatter)
// when end_backward itself throws midway, here a collective of its second bucket (an
// out-of-memory in a bucket's conversion does the same): the buckets launched before it are
// finished at once, the rest dropped, and a retry runs as if nothing had failed. Before, a throw
// there left the launched buckets queued (the recovery believed the pass had ended), so the retry
// finished a bucket twice, the second time through a reset work handle.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>

#include "support/fake_communicator.h"
#include "zero/flat_stage.h"

namespace abandoned_backward_test {

namespace {

using deepspeed::zero::FlatStage;
using deepspeed::zero::FlatStageOptions;
using deepspeed::zero::StageContext;

// Rank 0 of two; the peer passes three times this rank's tensor. `fail_at`: the index of the
// collective whose peer input throws (once), -1 for none.
struct ScriptedPeer {
  int fail_at = -1;
  int calls = 0;
  dstest::FakeCommunicator::PeerInput input() {
    return [this](const dstest::CallRecord&, int, const at::Tensor& mine) {
      if (calls++ == fail_at) throw std::runtime_error("injected failure in a bucket's collective");
      return mine * 3;
    };
  }
};

struct Trainee {
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> weights;
  std::shared_ptr<dstest::FakeCommunicator> comm;
  std::unique_ptr<FlatStage> stage;

  Trainee(bool scatter, ScriptedPeer& peer) {
    torch::manual_seed(3);
    for (int64_t n : {30, 40, 25, 35}) {
      params.push_back(torch::randn({n}).requires_grad_());
      weights.push_back(torch::randn({n}));
    }
    comm = std::make_shared<dstest::FakeCommunicator>(0, 2, peer.input());
    FlatStageOptions o;
    o.scatter_gradients = scatter;
    // Three buckets in buffer order (35 + 25 | 40 | 30: each at most 60 elements); no overlap:
    // end_backward launches them all.
    o.reduction.bucket_numel = 60;
    stage = std::make_unique<FlatStage>(
        params, StageContext{comm, torch::kCPU}, o, [](std::vector<at::Tensor> p) {
          return std::make_shared<torch::optim::SGD>(std::move(p), torch::optim::SGDOptions(0.1));
        });
  }
  void backward() {
    at::Tensor loss = torch::zeros({});
    for (size_t i = 0; i < params.size(); ++i) loss = loss + (params[i] * weights[i]).sum();
    loss.backward();
  }
  void train_step() {
    stage->begin_backward(true);
    backward();
    stage->end_backward(true);
    stage->step(1.0);
  }
};

class AbandonedBackward : public ::testing::TestWithParam<bool> {};

TEST_P(AbandonedBackward, AThrowInsideEndBackwardLeavesNothingForTheRetry) {
  const bool scatter = GetParam();
  ScriptedPeer clean;
  Trainee reference(scatter, clean);
  reference.train_step();

  ScriptedPeer peer;
  Trainee t(scatter, peer);
  peer.fail_at = 1;  // the second bucket's collective
  t.stage->begin_backward(true);
  EXPECT_THROW(
      {
        t.backward();  // stage 2 launches its buckets from the gradient hooks
        t.stage->end_backward(true);
      },
      std::runtime_error);
  t.stage->abandon_backward();
  if (!scatter) {
    // The first bucket (the last parameters, as autograd produces them) was summed (g + 3g) and
    // is finished now: averaged over the two ranks, 2g. The unlaunched one keeps this rank's g.
    EXPECT_TRUE(torch::allclose(t.params[3].grad(), 2 * t.weights[3]))
        << "the launched bucket was not finished at abandon";
    EXPECT_TRUE(torch::allclose(t.params[0].grad(), t.weights[0]));
  }
  t.stage->discard_gradients();  // the failed step is dropped; the retry starts clean
  t.comm->clear_calls();
  t.train_step();
  EXPECT_EQ(t.comm->calls().size(), 4u)
      << "one collective per bucket and the step's all-gather, nothing stale";
  EXPECT_TRUE(torch::equal(t.stage->flat().buffer(), reference.stage->flat().buffer()));
}

INSTANTIATE_TEST_SUITE_P(FlatStages, AbandonedBackward, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "stage2" : "stage1"; });

}  // namespace

}  // namespace abandoned_backward_test
