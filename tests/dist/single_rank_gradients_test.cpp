// ZeRO-2 at data-parallel world size 1 (zero/single_rank_gradients.h): with no peer there is
// nothing to reduce, so each gradient goes straight into the gradient partition as autograd
// produces it. Before, every gradient was copied into a bucket of reduce_bucket_size, which a
// single-process reduce-scatter copied into a fresh buffer, which was added into the partition:
// up to three buckets held beside the partition (2.8 GB for a 1.3B bf16 GPT) and ~18 bytes of
// memory traffic per parameter per micro-step, for the same values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <stdexcept>

#include <c10/core/CPUAllocator.h>

#include "deepspeed/comm.h"
#include "support/expect.h"
#include "support/training_run.h"
#include "util/torch_compat.h"
#include "zero/flat_stage.h"

namespace single_rank_gradients_test {

namespace {

int64_t reduce_scatters(const deepspeed::Engine& engine) {
  int64_t calls = 0;
  for (const auto& [op, st] : engine.communicator()->stats())
    if (op.rfind("reduce_scatter", 0) == 0) calls += st.calls;
  return calls;
}

struct Trained {
  dstest::RunResult result;
  int64_t reduce_scatters = 0;
};

Trained train(int stage, int accumulation, const nlohmann::json& extra) {
  dstest::RunSpec s;
  s.world_size = 1;
  s.steps = 6;
  s.config = dstest::base_config(2, accumulation, stage);
  s.config.merge_patch(extra);
  Trained run;
  s.after_training = [&run](deepspeed::Engine& e) { run.reduce_scatters = reduce_scatters(e); };
  run.result = dstest::train_gpt(s);
  return run;
}

}  // namespace

TEST(SingleRankGradients, Stage2HoldsNoBucketAndTrainsAsStage0) {
  for (int accumulation : {1, 3}) {
    SCOPED_TRACE("gradient_accumulation_steps " + std::to_string(accumulation));
    const nlohmann::json extra = {{"gradient_clipping", accumulation > 1 ? 0.05 : 0.0}};
    const Trained reference = train(0, accumulation, extra);
    const Trained zero = train(2, accumulation, extra);
    EXPECT_TRUE(dstest::bit_identical(zero.result.weights, reference.result.weights));
    EXPECT_EQ(zero.result.losses, reference.result.losses);
    // Stage 0 sums the squares parameter by parameter, stage 2 over its flat partition: only
    // the last bits of the norm may differ (a missing or doubled average moves it by 3x or 2x).
    EXPECT_LT(dstest::max_grad_norm_rel_diff(zero.result, reference.result), 1e-12);
    ASSERT_EQ(zero.result.memory.size(), 1u);
    EXPECT_EQ(zero.result.memory[0].comm_buffers, 0) << "a gradient bucket pool was allocated";
    EXPECT_EQ(zero.reduce_scatters, 0);
  }
}

// The first micro-step after a step writes the partition instead of adding to a zeroed one. A
// backward that throws before reaching a parameter must not leave that parameter's part holding
// the last step's gradient: it is zeroed when the pass is abandoned (and what the pass wrote
// stays, as a device gradient buffer keeps it).
TEST(SingleRankGradients, AFailedBackwardLeavesNoEarlierStepsGradient) {
  using deepspeed::zero::FlatStage;
  torch::manual_seed(4);
  at::Tensor a = torch::randn({30}).requires_grad_(), b = torch::randn({40}).requires_grad_();
  deepspeed::zero::FlatStageOptions o;
  o.scatter_gradients = true;
  o.reduction.bucket_numel = 30;  // a bucket per parameter
  FlatStage stage({a, b},
                  {deepspeed::comm::make_single_process_communicator(), torch::kCPU}, o,
                  [](std::vector<at::Tensor> p) {
                    return std::make_shared<torch::optim::SGD>(std::move(p),
                                                               torch::optim::SGDOptions(0.1));
                  });
  bool fail = false;
  a.register_hook([&fail](const at::Tensor& g) {
    if (fail) throw std::runtime_error("injected failure in backward");
    return g;
  });
  auto backward = [&] { ((a * a).sum() + (b * b * b).sum()).backward(); };
  stage.begin_backward(true);
  backward();
  stage.end_backward(true);
  stage.step(1.0);  // the partition still holds this step's gradients, not zeros

  fail = true;
  stage.begin_backward(true);
  EXPECT_THROW(backward(), std::runtime_error);
  stage.abandon_backward();
  const at::Tensor sums = stage.grad_square_sums({a});
  EXPECT_EQ(sums[0].item<double>(), 0.0) << "a's part kept the last step's gradient";
  // b's gradient may have come before the throw (then it is this pass's) or not (zeros).
  // In double: the partition's fp32 gradients, whose squares the stage sums in double.
  auto squares = [](const at::Tensor& g) {
    return g.detach().to(torch::kDouble).pow(2).sum().item<double>();
  };
  const double b_now = squares(3 * b * b);
  const double b_sum = sums[1].item<double>();
  EXPECT_TRUE(b_sum == 0.0 || std::abs(b_sum - b_now) <= 1e-6 * b_now) << b_sum << " vs " << b_now;

  fail = false;  // the failed step is dropped; the next pass writes every part again
  stage.discard_gradients();
  stage.begin_backward(true);
  backward();
  stage.end_backward(true);
  const at::Tensor clean = stage.grad_square_sums({a});
  EXPECT_NEAR(clean[0].item<double>(), squares(2 * a), 1e-6 * squares(2 * a));
  EXPECT_NEAR(clean[1].item<double>(), b_now, 1e-6 * b_now);
}

namespace {

// Every CPU allocation made while it is installed starts as 0xFF bytes (a NaN in every float
// type), so an element read before anything wrote it shows.
class PoisoningCpuAllocator : public deepspeed::compat::HostAllocator {
 public:
  explicit PoisoningCpuAllocator(c10::Allocator* base) : base_(base) {}
  c10::DataPtr allocate(size_t n) DS_ALLOCATE_CONST override {
    c10::DataPtr p = base_->allocate(n);
    if (p.get()) std::memset(p.get(), 0xFF, n);
    return p;  // freed through the wrapped allocator's own deleter
  }
  c10::DeleterFnPtr raw_deleter() const override { return base_->raw_deleter(); }
  c10::Allocator* base() const { return base_; }

 private:
  c10::Allocator* base_;
};

class PoisonedAllocations {
 public:
  PoisonedAllocations() : allocator_(new PoisoningCpuAllocator(c10::GetCPUAllocator())) {
    c10::SetCPUAllocator(allocator_, kPriority);
  }
  // Left alive, as util::AllocationMeter leaves its own: libtorch may have cached the pointer.
  ~PoisonedAllocations() { c10::SetCPUAllocator(allocator_->base(), kPriority); }

 private:
  static constexpr uint8_t kPriority = 200;
  PoisoningCpuAllocator* allocator_;
};

}  // namespace

// zero_optimization.release_gradients: the partition (allocated at the first backward, freed by
// each step) comes back at the next backward's first gradient uninitialized (no zeroing pass:
// every parameter's part is written, and the part of one that gets no gradient, `c`, zeroed when
// its bucket launches); the gaps between the parts (each is aligned to 16 elements: 30, 41 and 5
// leave 2, 7 and 11) are zeroed then. The norm reads the whole partition, so an element left as
// it was allocated makes it NaN here.
TEST(SingleRankGradients, AReleasedPartitionComesBackWithItsGapsZeroed) {
  using deepspeed::zero::FlatStage;
  const PoisonedAllocations poison;
  torch::manual_seed(5);
  at::Tensor a = torch::randn({30}).requires_grad_(), b = torch::randn({41}).requires_grad_();
  at::Tensor c = torch::randn({5}).requires_grad_();  // in no loss: never a gradient
  deepspeed::zero::FlatStageOptions o;
  o.scatter_gradients = true;
  o.reduction.bucket_numel = 30;  // a bucket per parameter
  o.reduction.release_gradients = true;
  FlatStage stage({a, b, c},
                  {deepspeed::comm::make_single_process_communicator(), torch::kCPU}, o,
                  [](std::vector<at::Tensor> p) {
                    return std::make_shared<torch::optim::SGD>(std::move(p),
                                                               torch::optim::SGDOptions(0.1));
                  });
  auto squares = [](const at::Tensor& g) {
    return g.detach().to(torch::kDouble).pow(2).sum().item<double>();
  };
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const double want = std::sqrt(squares(2 * a) + squares(3 * b * b));
    stage.begin_backward(true);
    ((a * a).sum() + (b * b * b).sum()).backward();
    stage.end_backward(true);
    const double norm = stage.global_grad_norm();
    EXPECT_NEAR(norm, want, 1e-6 * want);
    stage.step(1.0);
  }
}

}  // namespace single_rank_gradients_test
