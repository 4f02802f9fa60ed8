// BackwardReach: which parameters a backward can give a gradient, from the loss's graph alone,
// and when it must not tell (a node whose backward runs a backward of its own).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "deepspeed/checkpointing.h"
#include "deepspeed/zero_unit.h"
#include "zero/backward_reach.h"

namespace backward_reach_test {

using deepspeed::zero::BackwardReach;

// A user's custom function: its backward is code the walk cannot see into.
struct Doubled : torch::autograd::Function<Doubled> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x) {
    return x * 2;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list g) {
    return {g[0] * 2};
  }
};

struct Params {
  torch::Tensor used = torch::randn({3, 3}, torch::requires_grad());
  torch::Tensor bias = torch::randn({3}, torch::requires_grad());
  torch::Tensor unused = torch::randn({3}, torch::requires_grad());
  torch::Tensor frozen = torch::randn({3});
  torch::Tensor x = torch::randn({2, 3});
};

TEST(BackwardReach, SeesTheParametersTheLossUses) {
  Params p;
  auto loss = (p.x.matmul(p.used) + p.bias).pow(2).sum() + p.frozen.sum();
  BackwardReach reach(loss);
  ASSERT_TRUE(reach.known());
  EXPECT_TRUE(reach.reaches(p.used));
  EXPECT_TRUE(reach.reaches(p.bias));
  EXPECT_FALSE(reach.reaches(p.unused));
  // Used by an earlier graph only: its accumulator exists, but not in this graph.
  (p.unused * 2).sum().backward();
  EXPECT_FALSE(BackwardReach(loss).reaches(p.unused));
}

TEST(BackwardReach, DeepSpeedsOwnFunctionsAreSeenThrough) {
  Params p;
  auto loss = deepspeed::zero::linear(p.x, p.used, p.bias).sum();
  BackwardReach reach(loss);
  ASSERT_TRUE(reach.known());
  EXPECT_TRUE(reach.reaches(p.used));
  EXPECT_FALSE(reach.reaches(p.unused));
}

// The checkpointed segment's parameters enter the graph only when backward recomputes it: ruling
// out `used` here would refuse its gradient when it comes.
TEST(BackwardReach, AnActivationCheckpointTellsNothing) {
  Params p;
  auto y = deepspeed::checkpointing::checkpoint(
      [&](const torch::Tensor& in) { return in.matmul(p.used); }, p.x.requires_grad_(true));
  BackwardReach reach((y + p.bias).sum());
  EXPECT_FALSE(reach.known());
  EXPECT_TRUE(reach.reaches(p.used));
  EXPECT_TRUE(reach.reaches(p.unused));
}

TEST(BackwardReach, AUsersCustomFunctionTellsNothing) {
  Params p;
  BackwardReach reach(Doubled::apply(p.x.matmul(p.used)).sum());
  EXPECT_FALSE(reach.known());
  EXPECT_TRUE(reach.reaches(p.unused));
}

TEST(BackwardReach, ALossWithoutGraphTellsNothing) {
  Params p;
  BackwardReach reach(p.x.sum());
  EXPECT_FALSE(reach.known());
  EXPECT_TRUE(reach.reaches(p.unused));
}

}  // namespace backward_reach_test
