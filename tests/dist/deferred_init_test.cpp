// deepspeed::inference::DeferredInit: a model built in placeholder memory and loaded by
// init_inference. Per rank (ranks are threads), the real CPU bytes allocated while building and
// loading stay below the whole model at tp 2 (they reach it when the model is built the ordinary
// way, today's path before DeferredInit); logits equal the whole-built path at tp 1 and 2; the
// AutoTP test trees (NeoX-like, BERT-like) load the same values; a missing tensor and a missing
// checkpoint are refused by name; the allocator is put back, also after an exception.
#include "tp/deferred_init.h"

#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>

#include "checkpoint/safetensors.h"
#include "deepspeed/errors.h"
#include "deepspeed/inference.h"
#include "gpt/model.h"
#include "support/files.h"
#include "support/ranks.h"
#include "support/autotp_trees.h"
#include "support/expect.h"
#include "util/torch_compat.h"

namespace deferred_init_test {

namespace {
using deepspeed::comm::CommunicatorPtr;
using deepspeed::inference::DeferredInit;
using deepspeed::inference::is_deferred;

// Blocks dominate (4 x 12 x 128^2 of 0.26 M parameters + embeddings 40 K): at tp 2 half the
// split weights plus what stays whole is clearly below the whole model.
const gpt::GPTConfig kWide{256, 32, 4, 4, 128};

std::mutex rng_mutex;  // the rank threads share the global RNG

std::shared_ptr<gpt::GPTImpl> seeded_gpt(uint64_t seed, const gpt::GPTConfig& c = kWide) {
  std::lock_guard<std::mutex> lock(rng_mutex);
  torch::manual_seed(seed);
  return std::make_shared<gpt::GPTImpl>(c);
}

std::shared_ptr<gpt::GPTImpl> deferred_gpt(const gpt::GPTConfig& c = kWide) {
  DeferredInit deferred;
  return std::make_shared<gpt::GPTImpl>(c);
}

void write_weights(torch::nn::Module& m, const std::string& path, const std::string& skip = "") {
  deepspeed::checkpoint::NamedTensors tensors;
  for (auto& p : m.named_parameters())
    if (p.key() != skip) tensors.emplace_back(p.key(), p.value().detach());
  for (auto& b : m.named_buffers()) tensors.emplace_back(b.key(), b.value());
  deepspeed::checkpoint::write_safetensors(path, tensors);
}

// Per thread, the live and peak bytes of the real CPU memory handed out below it, for threads
// inside a Counting scope. Installed over the default allocator once and for good (storages keep
// their allocator's address, so it must outlive them); a DeferredInit scope installs its
// placeholders above it, so placeholders never reach the count.
class CountingAllocator final : public deepspeed::compat::HostAllocator {
 public:
  struct Counter {
    std::atomic<int64_t> live{0}, peak{0};
  };
  static thread_local std::shared_ptr<Counter> current;

  static void install() {
    static auto* installed = new CountingAllocator();
    (void)installed;
  }

  at::DataPtr allocate(size_t n) DS_ALLOCATE_CONST override {
    at::DataPtr inner = swap_.previous->allocate(n);
    if (!current || n == 0) return inner;
    const int64_t live = current->live += static_cast<int64_t>(n);
    int64_t peak = current->peak.load();
    while (live > peak && !current->peak.compare_exchange_weak(peak, live)) {
    }
    void* data = inner.get();
    const auto device = inner.device();
    return at::DataPtr(data, new Counted{std::move(inner), current, n}, &release, device);
  }
  at::DeleterFnPtr raw_deleter() const override { return swap_.previous->raw_deleter(); }

 private:
  struct Counted {
    at::DataPtr inner;
    std::shared_ptr<Counter> counter;
    size_t n;
  };
  static void release(void* ctx) {
    auto* c = static_cast<Counted*>(ctx);
    c->counter->live -= static_cast<int64_t>(c->n);
    delete c;
  }
  CountingAllocator() : swap_(deepspeed::tp::install_cpu_allocator(this)) {}
  deepspeed::tp::AllocatorSwap swap_;
};
thread_local std::shared_ptr<CountingAllocator::Counter> CountingAllocator::current;

// Counts this thread's real allocations while alive.
struct Counting {
  Counting() { CountingAllocator::current = std::make_shared<CountingAllocator::Counter>(); }
  ~Counting() { CountingAllocator::current.reset(); }
  int64_t peak() const { return CountingAllocator::current->peak.load(); }
};

int64_t bytes_of(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

torch::Tensor prompts() {
  auto gen = at::detail::createCPUGenerator(3);
  return torch::randint(256, {2, 12}, gen, torch::kLong);
}

class DeferredGpt : public ::testing::TestWithParam<bool> {};  // tied embeddings or not

TEST_P(DeferredGpt, RealBytesPerRankStayBelowTheWholeModelAndLogitsMatch) {
  gpt::GPTConfig config = kWide;
  config.tie_embeddings = GetParam();
  dstest::TempDir dir("deferred_init");
  const std::string file = dir / "model.safetensors";
  auto source = seeded_gpt(7, config);
  write_weights(*source, file);
  torch::NoGradGuard no_grad;
  source->eval();
  const auto idx = prompts();
  const auto ref = source->logits(idx);
  // The bound of the brief: split Linear weights / tp + everything kept whole + one tensor (the
  // largest: a transient while it is read). AutoTP splits the blocks' weights and the column
  // layers' biases (and an untied LM head, row-parallel as DeepSpeed's LmHeadLinearAllreduce);
  // the row layers' biases, norms, embeddings and masks stay whole. The bound counts the head
  // as whole, which only over-allows.
  int64_t whole = 0, split = 0, largest = 0;
  for (auto& p : source->named_parameters()) {
    whole += bytes_of(p.value());
    largest = std::max(largest, bytes_of(p.value()));
    const auto& k = p.key();
    if (k.rfind("block", 0) == 0 && (k.find(".weight") != std::string::npos) &&
        (k.find(".qkv.") != std::string::npos || k.find(".proj.") != std::string::npos ||
         k.find(".fc.") != std::string::npos))
      split += bytes_of(p.value());
    else if (k.find(".qkv.bias") != std::string::npos || k.find(".fc.bias") != std::string::npos)
      split += bytes_of(p.value());
  }
  for (auto& b : source->named_buffers()) whole += bytes_of(b.value());
  const int64_t replicated = whole - split;

  CountingAllocator::install();
  for (int tp : {1, 2}) {
    const int64_t bound = split / tp + replicated + largest;
    run_ranks(2, [&](CommunicatorPtr comm) {
      torch::NoGradGuard no_grad;
      int64_t deferred_peak = 0, whole_peak = 0;
      std::shared_ptr<gpt::GPTImpl> lazy, built;
      std::shared_ptr<deepspeed::InferenceEngine> lazy_engine, built_engine;
      {
        Counting count;
        lazy = deferred_gpt(config);
        EXPECT_TRUE(is_deferred(lazy->named_parameters()["block0.attn.qkv.weight"]));
        lazy_engine =
            deepspeed::init_inference(lazy, {.tp_size = tp, .checkpoint = file, .comm = comm});
        deferred_peak = count.peak();
      }
      {
        Counting count;  // today's path: built whole at random, then sharded
        built = seeded_gpt(1, config);
        built_engine =
            deepspeed::init_inference(built, {.tp_size = tp, .checkpoint = file, .comm = comm});
        whole_peak = count.peak();
      }
      EXPECT_LT(deferred_peak, bound) << "tp " << tp << ": whole model " << whole;
      EXPECT_GE(whole_peak, whole) << "tp " << tp;
      if (tp == 2) EXPECT_LT(bound, whole);  // else the bound would not tell the paths apart
      for (auto& p : lazy->named_parameters()) EXPECT_FALSE(is_deferred(p.value())) << p.key();
      const auto got = lazy->logits(idx);
      EXPECT_LT((got - built->logits(idx)).abs().max().item<double>(), 1e-5) << "tp " << tp;
      EXPECT_LT((got - ref).abs().max().item<double>(), 1e-5) << "tp " << tp;
    });
  }
}

INSTANTIATE_TEST_SUITE_P(TiedOrNot, DeferredGpt, ::testing::Bool());

using dstest::TreeNode;

// The AutoTP test trees (support/autotp_trees.h) built deferred load the whole-built values.
TEST(DeferredInit, AutoTPTreesLoadTheWholeBuiltValues) {
  dstest::TempDir dir("deferred_trees");
  for (auto make : {&dstest::neox_like_tree, &dstest::bert_like_tree}) {
    auto source = make();
    {
      torch::NoGradGuard no_grad;
      for (auto& p : source->parameters()) p.normal_();  // LayerNorm's ones/zeros too
    }
    write_weights(*source, dir / "tree.safetensors");
    run_ranks(2, [&](CommunicatorPtr comm) {
      std::shared_ptr<TreeNode> lazy;
      {
        DeferredInit deferred;
        lazy = make();
      }
      auto whole = make();
      const std::string file = dir / "tree.safetensors";
      auto e1 = deepspeed::init_inference(lazy, {.tp_size = 2, .checkpoint = file, .comm = comm});
      auto e2 = deepspeed::init_inference(whole, {.tp_size = 2, .checkpoint = file, .comm = comm});
      EXPECT_FALSE(e1->sharded().empty());
      auto want = whole->named_parameters();
      for (auto& p : lazy->named_parameters())
        EXPECT_TRUE(torch::equal(p.value(), want[p.key()])) << p.key();
    });
  }
}

TEST(DeferredInit, RefusesAMissingTensorOrCheckpointByName) {
  dstest::TempDir dir("deferred_bad");
  write_weights(*seeded_gpt(7), dir / "partial.safetensors", "block2.mlp.fc.weight");
  auto msg = dstest::message_of<deepspeed::CheckpointError>([&] {
    deepspeed::init_inference(deferred_gpt(), {.checkpoint = dir / "partial.safetensors"});
  });
  EXPECT_NE(msg.find("has no tensor \"block2.mlp.fc.weight\""), std::string::npos) << msg;
  msg = dstest::message_of<deepspeed::ConfigError>([&] { deepspeed::init_inference(deferred_gpt(), {}); });
  EXPECT_NE(msg.find("\"wte.weight\" was built under inference::DeferredInit"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("no checkpoint was given"), std::string::npos) << msg;
  msg = dstest::message_of<deepspeed::ConfigError>([&] {
    DeferredInit deferred;
    deepspeed::init_inference(std::make_shared<gpt::GPTImpl>(kWide), {});
  });
  EXPECT_NE(msg.find("called inside an inference::DeferredInit scope"), std::string::npos) << msg;
}

TEST(DeferredInit, RoutesOnlyItsThreadAndPutsTheAllocatorBack) {
  at::Allocator* before = c10::GetCPUAllocator();
  try {
    DeferredInit deferred;
    EXPECT_NE(c10::GetCPUAllocator(), before);
    EXPECT_TRUE(DeferredInit::active());
    auto mine = torch::empty({1024});
    EXPECT_TRUE(is_deferred(mine));
    bool other_deferred = true;
    std::thread([&] { other_deferred = is_deferred(torch::ones({1024})); }).join();
    EXPECT_FALSE(other_deferred);  // another thread, no scope: real memory
    {
      DeferredInit nested;
      EXPECT_TRUE(is_deferred(torch::empty({3})));
    }
    EXPECT_TRUE(is_deferred(torch::empty({3})));  // the outer scope still holds
    // Two placeholders alias the same pages (the point), in distinct address ranges (ATen's
    // overlap checks compare addresses).
    auto other = torch::empty({1024});
    EXPECT_NE(other.data_ptr(), mine.data_ptr());
    throw std::runtime_error("thrown while building");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(c10::GetCPUAllocator(), before);
  EXPECT_FALSE(DeferredInit::active());
  EXPECT_FALSE(is_deferred(torch::empty({4})));
}

}  // namespace

}  // namespace deferred_init_test
