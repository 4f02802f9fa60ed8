// An out-of-memory reaches the user in words: which memory ran out, in which rank and phase, what
// was being allocated (deepspeed's own buffer, named by the AllocatingFor scope around it, or
// else the model's tensors), the bytes asked and what to try; never a libtorch stack. On the CPU
// through a wrapper of libtorch's allocator that fails past a size with the CPU allocator's own
// error (a real request too large could succeed under memory overcommit); the CUDA messages are
// tests/gpu's.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <stdexcept>
#include <thread>

#include "deepspeed/deepspeed.h"
#include "device/out_of_memory.h"
#include "support/expect.h"
#include "support/failing_cpu_allocator.h"
#include "support/fake_communicator.h"
#include "support/two_layers.h"
#include "util/host_allocator.h"

namespace out_of_memory_test {

namespace {
using deepspeed::AllocatingFor;
using deepspeed::out_of_memory_message;
using deepspeed::take_failed_allocation;

constexpr size_t kLimit = 1 << 20;  // allocations of 1 MiB or more fail while armed
constexpr int64_t kTooMany = int64_t{1} << 21;  // floats: 8 MiB

// The allocation of kTooMany floats fails: returns libtorch's message.
std::string cpu_allocator_failure() {
  dstest::FailingCpuAllocatorScope failing(kLimit);
  failing->arm();
  try {
    (void)torch::empty({kTooMany});
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  ADD_FAILURE() << "the 8 MiB allocation succeeded";
  return "";
}

TEST(OutOfMemory, TheCpuAllocatorsFailureIsHostMemoryWithTheBytesAsked) {
  auto msg = out_of_memory_message(cpu_allocator_failure(), "rank 0's backward", 2, c10::kCPU);
  ASSERT_TRUE(msg.has_value());
  EXPECT_CONTAINS(*msg, "out of host memory in rank 0's backward (zero stage 2)");
  EXPECT_CONTAINS(*msg, "tried to allocate 8.0 MiB");
  EXPECT_CONTAINS(*msg, "\"nvme\"") << "for host memory, offloading to \"cpu\" is no help";
  EXPECT_FALSE(out_of_memory_message("size mismatch", "rank 0's step", 2, c10::kCPU));
}

// Once the library has tuned malloc to keep freed memory (every entry point does), a host report
// names the switch that gives it back; a report of device memory does not (what malloc keeps is
// host memory).
TEST(OutOfMemory, AHostReportNamesTheMallocTuningOnceApplied) {
  const auto& tuning = deepspeed::util::tune_host_allocator();
  if (!tuning.apply) GTEST_SKIP() << "malloc left alone here: " << tuning.reason;
  ASSERT_TRUE(deepspeed::util::host_allocator_tuned());
  auto msg = out_of_memory_message(cpu_allocator_failure(), "rank 0's step", 1, c10::kCPU);
  ASSERT_TRUE(msg.has_value());
  EXPECT_CONTAINS(*msg, "; DS_MALLOC_TUNING=0 also gives back what malloc keeps of freed host "
                        "memory (up to 1024 MiB per process");
  msg = out_of_memory_message("CUDA error: out of memory", "rank 0's step", 1,
                              c10::Device(c10::kCUDA, 0));
  ASSERT_TRUE(msg.has_value());
  EXPECT_EQ(msg->find("DS_MALLOC_TUNING"), std::string::npos) << *msg;
}

TEST(OutOfMemory, TheInnermostScopeAnExceptionLeavesNamesTheBuffer) {
  deepspeed::forget_failed_allocation();
  {
    dstest::FailingCpuAllocatorScope failing(kLimit);
    failing->arm();
    try {
      AllocatingFor outer("stage 3's gradient bucket of unit", 7, 10, 4);
      AllocatingFor inner("stage 3's gathered parameters of unit", 3, 3 << 20, 2);
      (void)torch::empty({kTooMany});
    } catch (const c10::Error&) {
    }
  }
  EXPECT_EQ(take_failed_allocation(), "stage 3's gathered parameters of unit 3 (3145728 elements, "
                                      "6.0 MiB)");
  EXPECT_EQ(take_failed_allocation(), "") << "taken once";
  { AllocatingFor quiet("a gradient bucket", -1, 1, 4); }
  EXPECT_EQ(take_failed_allocation(), "") << "a scope left without an exception names nothing";
  try {
    AllocatingFor bucket("a gradient bucket", -1, 1, 4);
    throw std::runtime_error("not memory");
  } catch (const std::runtime_error&) {
  }
  deepspeed::forget_failed_allocation();
  EXPECT_EQ(take_failed_allocation(), "") << "each engine call forgets what none reported";
}

// Within one engine call: a scope left by an exception that was caught and handled (a clean-up's
// error swallowed) must not name its buffer in a later out-of-memory's report. The next scope
// this thread opens outside any handler drops that record; one opened inside the handler (a
// clean-up before the rethrow) keeps it for the report on its way.
TEST(OutOfMemory, AScopeLeftByAHandledExceptionNamesNothingLater) {
  deepspeed::forget_failed_allocation();
  auto leave_by_exception = [](const char* what) {
    AllocatingFor scope(what, -1, 1, 4);
    throw std::runtime_error("not memory");
  };
  try {
    leave_by_exception("a swallowed bucket");
  } catch (const std::runtime_error&) {
  }
  {
    dstest::FailingCpuAllocatorScope failing(kLimit);
    failing->arm();
    try {
      AllocatingFor unit("stage 3's gathered parameters of unit", 5, 3 << 20, 2);
      (void)torch::empty({kTooMany});
    } catch (const c10::Error&) {
    }
  }
  EXPECT_EQ(take_failed_allocation(), "stage 3's gathered parameters of unit 5 (3145728 elements, "
                                      "6.0 MiB)");
  try {
    leave_by_exception("the failed bucket");
  } catch (const std::runtime_error&) {
    AllocatingFor clean_up("a clean-up's buffer", -1, 1, 4);  // inside the handler
  }
  EXPECT_EQ(take_failed_allocation(), "the failed bucket (1 elements, 0.0 MiB)");

  // Another thread's record, from an exception handled there (autograd's device thread, say),
  // does not keep this thread's later one out: the report names the newest.
  std::thread([&] {
    try {
      leave_by_exception("another thread's bucket");
    } catch (const std::runtime_error&) {
    }
  }).join();
  try {
    leave_by_exception("this thread's unit");
  } catch (const std::runtime_error&) {
    EXPECT_EQ(take_failed_allocation(), "this thread's unit (1 elements, 0.0 MiB)");
  }
  EXPECT_EQ(take_failed_allocation(), "") << "taken with the others";
}

// Ranks running as threads of one process (the dist tests) fail and report at once: one rank's
// report, or the start of its next engine call, neither takes nor drops the other's record. Here
// in the order that lost rank 0's record before: both fail, rank 1 reports and starts its next
// call, then rank 0 reports.
TEST(OutOfMemory, RanksAsThreadsEachReportTheirOwnBuffer) {
  auto fail_in = [](const char* what) {
    try {
      AllocatingFor scope(what, -1, 1, 4);
      throw std::runtime_error("out of memory");
    } catch (const std::runtime_error&) {
    }
  };
  std::string rank0, rank1;
  std::thread rank0_thread([&] {
    deepspeed::forget_failed_allocation();  // its engine call begins
    fail_in("rank 0's bucket");
    std::thread rank1_thread([&] {
      deepspeed::forget_failed_allocation();
      fail_in("rank 1's bucket");
      rank1 = take_failed_allocation();
      deepspeed::forget_failed_allocation();  // its next engine call
    });
    rank1_thread.join();
    rank0 = take_failed_allocation();
  });
  rank0_thread.join();
  EXPECT_EQ(rank0, "rank 0's bucket (1 elements, 0.0 MiB)");
  EXPECT_EQ(rank1, "rank 1's bucket (1 elements, 0.0 MiB)");
}

using dstest::TwoLayersImpl;

auto two_layer_engine(std::shared_ptr<TwoLayersImpl> model, int stage,
                      const std::string& optimizer = "SGD",
                      deepspeed::comm::CommunicatorPtr comm = nullptr) {
  nlohmann::json config = {{"train_micro_batch_size_per_gpu", 2},
                           {"optimizer", {{"type", optimizer}, {"params", {{"lr", 0.1}}}}},
                           {"zero_optimization", {{"stage", stage}}}};
  return deepspeed::initialize<TwoLayersImpl>({.model = model, .config_json = config, .comm = comm})
      .engine;
}

// Rank 0 of two (a rank alone in its data-parallel group holds no bucket: its gradients go
// straight into its partition).
TEST(OutOfMemory, InTheBackwardNamingTheGradientBucketBeingAllocated) {
  auto model = std::make_shared<TwoLayersImpl>();
  auto engine = two_layer_engine(model, 2, "SGD", std::make_shared<dstest::FakeCommunicator>(0, 2));
  dstest::FailingCpuAllocatorScope failing(3 << 20);
  auto loss = engine->forward(torch::randn({2, 700}));
  failing->arm();
  try {
    engine->backward(loss);
    FAIL() << "the bucket's allocation did not fail";
  } catch (const deepspeed::Error& e) {
    failing->disarm();
    const std::string msg = e.what();
    EXPECT_CONTAINS(msg, "out of host memory in rank 0's backward while allocating a gradient "
                         "bucket (reduce_bucket_size) (980000 elements, 3.7 MiB)");
    EXPECT_CONTAINS(msg, "(zero stage 2)");
    EXPECT_EQ(msg.find("frame #"), std::string::npos) << msg;
  }
  failing->disarm();
  // The failed pass gave its buffers back: the same step trains once memory is there.
  engine->backward(engine->forward(torch::randn({2, 700})));
  engine->step();
}

TEST(OutOfMemory, InTheModelsOwnTensorsSaysSo) {
  auto model = std::make_shared<TwoLayersImpl>();
  auto engine = two_layer_engine(model, 1);
  dstest::FailingCpuAllocatorScope failing(kLimit);
  model->a->weight.register_hook([&failing](const at::Tensor& g) {
    failing->arm();
    (void)torch::empty({kTooMany});  // the model's own backward asking for too much
    return g;
  });
  try {
    engine->backward(engine->forward(torch::randn({2, 700})));
    FAIL() << "the 8 MiB allocation succeeded";
  } catch (const deepspeed::Error& e) {
    failing->disarm();
    const std::string msg = e.what();
    EXPECT_CONTAINS(msg, "out of host memory in rank 0's backward (in no buffer deepspeed names: "
                         "most likely the model's activations' gradients) (zero stage 1): tried "
                         "to allocate 8.0 MiB");
    EXPECT_EQ(msg.find("while allocating"), std::string::npos) << msg;
  }
}

// Adam's moments come into being at the first step: the report names them, with the partition's
// size (stage 1 at world 1: both layers, 3.7 MiB each; the norm's chunks before them are 2 MiB).
TEST(OutOfMemory, AtTheFirstStepNamingAdamsMoments) {
  auto model = std::make_shared<TwoLayersImpl>();
  auto engine = two_layer_engine(model, 1, "Adam");
  engine->backward(engine->forward(torch::randn({2, 700})));
  dstest::FailingCpuAllocatorScope failing(3 << 20);
  failing->arm();
  try {
    engine->step();
    FAIL() << "the moments' allocation did not fail";
  } catch (const deepspeed::Error& e) {
    failing->disarm();
    EXPECT_CONTAINS(std::string(e.what()),
                    "out of host memory in rank 0's step while allocating Adam's moments "
                    "(exp_avg and exp_avg_sq, each) (980000 elements, 3.7 MiB) (zero stage 1)");
  }
}


// At initialize the stage's own buffers are named too: here the flat parameters of stage 2 (both
// layers, 3.7 MiB), the first buffer the size of the model it allocates.
TEST(OutOfMemory, AtInitializeNamingTheFlatParameters) {
  auto model = std::make_shared<TwoLayersImpl>();
  dstest::FailingCpuAllocatorScope failing(3 << 20);
  failing->arm();
  try {
    two_layer_engine(model, 2);
    FAIL() << "the flat parameters' allocation did not fail";
  } catch (const deepspeed::Error& e) {
    failing->disarm();
    EXPECT_CONTAINS(std::string(e.what()),
                    "while allocating the flat parameters (every trainable parameter's, one "
                    "buffer) (980000 elements, 3.7 MiB)");
  }
}

}  // namespace

}  // namespace out_of_memory_test
