// ZeRO-3 gradient swap file (offload_optimizer nvme): slices accumulate across micro-steps through
// the file, the boundary micro-step's squared norm covers exactly what the optimizer will read,
// discard() starts over from zero, and a file truncated under the job is an IOError naming it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include <torch/torch.h>

#include "deepspeed/errors.h"
#include "offload/grad_store.h"
#include "support/files.h"
#include "support/stage3_layouts.h"

namespace fs = std::filesystem;
using deepspeed::offload::GradStore;
using deepspeed::zero::Stage3Layout;

namespace {

// A root of 10 elements and units of 5000 and 9000 elements (world size 1).
Stage3Layout layout() { return dstest::one_rank_layout({10, 5000, 9000}); }

// One micro-step adding `g` (the whole partition) unit by unit, in backward order.
void micro_step(GradStore& store, const Stage3Layout& L, const at::Tensor& g, bool boundary) {
  store.begin_micro_step(boundary);
  for (int u = 2; u >= 0; --u) {
    store.open(u).add_(g.narrow(0, L.units[u].partition_offset, L.units[u].layout.partition_numel));
    store.close(u);
  }
  store.end_micro_step();
}

at::Tensor read_back(GradStore& store, const Stage3Layout& L) {
  std::vector<at::Tensor> parts;
  for (auto [begin, n] : deepspeed::offload::unit_aligned_groups(L, 3000)) {
    store.prefetch(begin, n);
    parts.push_back(store.get(begin, n).clone());
    store.release(begin, n);
  }
  return torch::cat(parts);
}

}  // namespace

TEST(GradStore, AccumulatesAcrossMicroStepsThroughTheFile) {
  dstest::TempDir dir("grad_store_test", dstest::TempDir::Base::kDisk);
  const Stage3Layout L = layout();
  GradStore store(L, torch::kFloat, dir.path(), dstest::small_aio());
  at::Tensor a = torch::randn({L.partition_numel}), b = torch::randn({L.partition_numel});
  micro_step(store, L, a, false);
  micro_step(store, L, b, true);
  at::Tensor sum = a + b;
  EXPECT_TRUE(torch::equal(read_back(store, L), sum));
  EXPECT_NEAR(store.squared_norm(), sum.to(torch::kDouble).pow(2).sum().item<double>(), 1e-9);
  EXPECT_EQ(store.resident_bytes(), 0);

  store.discard();  // after the step: the next micro-step starts from zero
  micro_step(store, L, b, true);
  EXPECT_TRUE(torch::equal(read_back(store, L), b));
}

TEST(GradStoreErrors, FileTruncatedUnderTheJobIsAnIOErrorNamingIt) {
  dstest::TempDir dir("grad_store_test", dstest::TempDir::Base::kDisk);
  const Stage3Layout L = layout();
  GradStore store(L, torch::kBFloat16, dir.path(), dstest::small_aio());
  micro_step(store, L, torch::ones({L.partition_numel}), true);
  ASSERT_EQ(::truncate(store.path().c_str(), 4096), 0);
  try {
    read_back(store, L);
    FAIL() << "expected IOError";
  } catch (const deepspeed::IOError& e) {
    EXPECT_NE(std::string(e.what()).find(store.path()), std::string::npos) << e.what();
  }
}

TEST(GradStoreErrors, MissingFolderNamesTheKey) {
  try {
    GradStore store(layout(), torch::kFloat, "/nonexistent/grad/swap", dstest::small_aio());
    FAIL() << "expected IOError";
  } catch (const deepspeed::IOError& e) {
    EXPECT_NE(std::string(e.what()).find("offload_optimizer.nvme_path"), std::string::npos) << e.what();
  }
}
