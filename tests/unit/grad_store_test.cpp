// ZeRO-3 gradient swap file (offload_optimizer nvme): slices accumulate across micro-steps through
// the file, the boundary micro-step's squared norm covers exactly what the optimizer will read,
// discard() starts over from zero, and a file truncated under the job is an IOError naming it.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>

#include <torch/torch.h>

#include "deepspeed/errors.h"
#include "offload/grad_store.h"
#include "support/files.h"
#include "support/held_downloads.h"
#include "support/stage3_layouts.h"
#include "support/swap_files.h"

namespace grad_store_test {

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
  const auto file = dstest::unlinked_files_in(dir.path());
  ASSERT_EQ(file.size(), 1u);
  const std::string whole = dstest::read_bytes(file[0]);
  ASSERT_EQ(::truncate(file[0].c_str(), 4096), 0);
  try {
    read_back(store, L);
    FAIL() << "expected IOError";
  } catch (const deepspeed::IOError& e) {
    EXPECT_NE(std::string(e.what()).find(store.path()), std::string::npos) << e.what();
  }
  // A read that failed is read again by the next get() (before, it returned what the failed
  // read had left in the buffer).
  dstest::write_bytes(file[0], whole);
  EXPECT_TRUE(torch::equal(read_back(store, L), torch::ones({L.partition_numel})));
}

// A slice whose write failed (here: past RLIMIT_FSIZE, as on a full disk) leaves the file without
// that unit's gradients: the optimizer's reads then say so, until discard() starts a new
// accumulation. Before, the next wait forgot the failure and the step read the incomplete file.
TEST(GradStoreErrors, AFailedWriteMakesTheAccumulationRefusedUntilDiscard) {
  dstest::TempDir dir("grad_store_test", dstest::TempDir::Base::kDisk);
  const Stage3Layout L = layout();
  GradStore store(L, torch::kFloat, dir.path(), dstest::small_aio());
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 4096;  // the first slice's place only
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  try {
    micro_step(store, L, torch::ones({L.partition_numel}), true);
    ADD_FAILURE() << "no write failed";
  } catch (const deepspeed::IOError& e) {
    EXPECT_NE(std::string(e.what()).find("File too large"), std::string::npos) << e.what();
  }
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  ::signal(SIGXFSZ, old_handler);
  try {
    read_back(store, L);
    FAIL() << "the incomplete gradients were read";
  } catch (const deepspeed::IOError& e) {
    EXPECT_NE(std::string(e.what()).find("a write failed earlier"), std::string::npos) << e.what();
  }
  store.discard();
  at::Tensor b = torch::randn({L.partition_numel});
  micro_step(store, L, b, true);
  EXPECT_TRUE(torch::equal(read_back(store, L), b));
}

// A missing folder is made (create_swap_file); one under a regular file cannot be.
TEST(GradStoreErrors, FolderThatCannotBeMadeNamesTheKey) {
  dstest::TempDir dir("grad_store_test");
  dstest::write_bytes(dir / "file", "x");
  try {
    GradStore store(layout(), torch::kFloat, dir / "file/swap", dstest::small_aio());
    FAIL() << "expected IOError";
  } catch (const deepspeed::IOError& e) {
    EXPECT_NE(std::string(e.what()).find("offload_optimizer.nvme_path"), std::string::npos) << e.what();
  }
}

using dstest::HeldDownloads;

// A store whose downloads the test holds back. Outside the anonymous namespace: tests derive
// from it (this file's namespace keeps it apart in a unity batch; -Wsubobject-linkage).
class GradStoreDownloads : public ::testing::Test {
 protected:
  dstest::TempDir dir{"grad_store_test", dstest::TempDir::Base::kDisk};
  const Stage3Layout L = layout();
  HeldDownloads downloads;
  GradStore store{L, torch::kFloat, dir.path(), dstest::small_aio(), downloads.downloader()};
};

// A bucket still on its way down is added once its fence has passed, found by a later call
// without waiting; its unit goes back to the file only after its last bucket is added, even when
// the stage says the unit is complete before that.
TEST_F(GradStoreDownloads, StillComingDownAreAddedLaterWithoutBlocking) {
  at::Tensor g = torch::randn({L.partition_numel});
  auto part = [&](int u, int64_t first, int64_t n) {
    return g.narrow(0, L.units[u].partition_offset + first, n);
  };
  for (int step = 0; step < 2; ++step) {  // the second runs through the file (accumulated)
    const size_t base = downloads.fences.size();
    store.begin_micro_step(step == 1);
    store.accumulate(2, 0, part(2, 0, 4000));
    store.accumulate(2, 4000, part(2, 4000, 5000));
    store.unit_complete(2);  // both buckets still coming down
    const int64_t pending = store.resident_bytes();
    EXPECT_GE(pending, 9000 * 4) << "the downloads pending are resident";
    downloads.release(base);
    store.accumulate(1, 0, part(1, 0, 5000));  // adds unit 2's first bucket on the way
    store.unit_complete(1);
    downloads.release(base + 1);
    downloads.release(base + 2);
    store.accumulate(0, 0, part(0, 0, 10));
    store.unit_complete(0);
    EXPECT_EQ(downloads.blocking_waits, 0) << "the host waited for a download";
    store.end_micro_step();
    EXPECT_EQ(downloads.blocking_waits, 1) << "end_micro_step waits for the last one";
    downloads.blocking_waits = 0;
  }
  at::Tensor sum = g + g;
  EXPECT_TRUE(torch::equal(read_back(store, L), sum));
  EXPECT_NEAR(store.squared_norm(), sum.to(torch::kDouble).pow(2).sum().item<double>(), 1e-6);
  EXPECT_EQ(store.resident_bytes(), 0);
}

// Beyond four downloads pending the host waits for the oldest, so their page-locked buffers stay
// bounded however far behind the GPU is.
TEST_F(GradStoreDownloads, AtMostFourArePending) {
  store.begin_micro_step(true);
  for (int k = 0; k < 6; ++k) store.accumulate(2, 1000 * k, torch::ones({1000}));
  EXPECT_EQ(downloads.blocking_waits, 2);
  EXPECT_EQ(store.resident_bytes(), 9000 * 4 + 4 * 1000 * 4) << "the slice and four downloads";
  store.unit_complete(2);
  store.unit_complete(1);
  store.unit_complete(0);
  store.end_micro_step();
  at::Tensor want = torch::zeros({L.units[2].layout.partition_numel});
  want.narrow(0, 0, 6000).fill_(1);
  EXPECT_TRUE(torch::equal(read_back(store, L).narrow(0, L.units[2].partition_offset, 9000), want));
}

// A first micro-step's backward that throws midway, after unit 2 went to the file and while unit
// 1's bucket is still coming down: the next micro-step adds to both buckets, as a device partition
// (and PyTorch's .grad) would, instead of dropping them or writing over unit 2.
TEST_F(GradStoreDownloads, AFailedBackwardsBucketsStayInTheGradients) {
  store.begin_micro_step(true);
  store.accumulate(2, 0, torch::full({4000}, 5.0));
  downloads.release(0);
  store.unit_complete(2);  // to the file
  store.accumulate(1, 0, torch::full({5000}, 7.0));  // still coming down
  // ... and the backward throws here.
  at::Tensor g = torch::randn({L.partition_numel});
  store.begin_micro_step(true);
  for (int u = 2; u >= 0; --u) {
    const int64_t n = L.units[u].layout.partition_numel;
    store.accumulate(u, 0, g.narrow(0, L.units[u].partition_offset, n));
    downloads.release(downloads.fences.size() - 1);
    store.unit_complete(u);
  }
  store.end_micro_step();
  at::Tensor want = g.clone();
  want.narrow(0, L.units[2].partition_offset, 4000).add_(5.0);
  want.narrow(0, L.units[1].partition_offset, 5000).add_(7.0);
  EXPECT_TRUE(torch::equal(read_back(store, L), want));
  EXPECT_NEAR(store.squared_norm(), want.to(torch::kDouble).pow(2).sum().item<double>(), 1e-6)
      << "the boundary's norm is of what the optimizer reads";
  EXPECT_EQ(store.resident_bytes(), 0);
}

// A download whose add throws (here: the read of its unit's earlier sum from a file truncated
// under the job) still counts as added for its unit: once the file is back, the next micro-step
// completes every unit. Before, the unit kept waiting for that download forever and every later
// micro-step ended with units still open.
TEST_F(GradStoreDownloads, ADownloadWhoseAddFailedLeavesNoUnitWaiting) {
  const auto add_one_micro_step = [&](bool boundary) {
    store.begin_micro_step(boundary);
    for (int u = 2; u >= 0; --u) {
      store.accumulate(u, 0, torch::ones({L.units[u].layout.partition_numel}));
      downloads.release(downloads.fences.size() - 1);
      store.unit_complete(u);
    }
    store.end_micro_step();
  };
  add_one_micro_step(false);  // in the file: the next micro-step reads each unit back
  const auto file = dstest::unlinked_files_in(dir.path());
  ASSERT_EQ(file.size(), 1u);
  const auto bytes = fs::file_size(file[0]);
  ASSERT_EQ(::truncate(file[0].c_str(), 0), 0);
  store.begin_micro_step(true);
  store.accumulate(2, 0, torch::ones({4000}));
  downloads.release(downloads.fences.size() - 1);
  EXPECT_THROW(store.unit_complete(2), deepspeed::IOError);  // its add reads unit 2 back
  // ... the backward threw; the file comes back (its contents lost: zeros) and training goes on.
  ASSERT_EQ(::truncate(file[0].c_str(), static_cast<off_t>(bytes)), 0);
  add_one_micro_step(true);
  EXPECT_EQ(store.resident_bytes(), 0);
}

// A GPU's bucket stays allocated until its download has read it: those bytes are the store's
// device temporaries (the MemoryReport's communication buffers), at most while four are pending.
TEST_F(GradStoreDownloads, BucketsOnADeviceCountUntilTheirDownloadHasRead) {
  const auto on_device = torch::TensorOptions().device(torch::kMeta);
  store.begin_micro_step(true);
  store.accumulate(2, 0, torch::empty({4000}, on_device));
  store.accumulate(2, 4000, torch::empty({5000}, on_device));
  EXPECT_EQ(store.pending_device_bytes(), 9000 * 4);
  downloads.release(0);
  store.unit_complete(2);  // adds the first; the second is still coming down
  EXPECT_EQ(store.pending_device_bytes(), 5000 * 4);
  downloads.release(1);
  store.unit_complete(1);
  store.unit_complete(0);
  store.end_micro_step();
  EXPECT_EQ(store.pending_device_bytes(), 0);
  EXPECT_EQ(store.peak_pending_device_bytes(), 9000 * 4);
  at::Tensor want = torch::zeros({L.partition_numel});
  want.narrow(0, L.units[2].partition_offset, 9000).fill_(1);
  EXPECT_TRUE(torch::equal(read_back(store, L), want));
}

}  // namespace grad_store_test
