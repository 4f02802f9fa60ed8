// NVMe optimizer swap: Adam over sub-groups read from and written back to a file through io_uring
// must give bit for bit what the in-memory update gives, whatever the sub-group size and buffer
// count; I/O failures must stop with an IOError naming the file.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>

#include <torch/torch.h>

#include "deepspeed/errors.h"
#include "offload/swapped_adam.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/swap_files.h"

namespace swapped_adam_test {

namespace fs = std::filesystem;
using deepspeed::offload::SwapOptions;
using deepspeed::offload::SwappedAdam;

namespace {

deepspeed::optim::AdamStepParams hyper(int64_t step) {
  deepspeed::optim::AdamStepParams hp;
  hp.lr = 1e-2f;
  hp.weight_decay = 0.1f;
  hp.step = step;
  hp.grad_scale = 0.5f;
  return hp;
}

SwapOptions options(const fs::path& dir, int64_t sub_group, int buffers) {
  SwapOptions o;
  o.dir = dir.string();
  o.sub_group_size = sub_group;
  o.buffer_count = buffers;
  o.aio.block_size = 8192;  // several pieces per sub-group
  o.aio.queue_depth = 4;
  return o;
}

}  // namespace

class SwappedAdamMatchesInMemory
    : public ::testing::TestWithParam<std::tuple<int64_t, int, at::ScalarType>> {};

TEST_P(SwappedAdamMatchesInMemory, BitForBitOverSeveralSteps) {
  auto [sub_group, buffers, dtype] = GetParam();
  dstest::TempDir dir("swapped_adam_test", dstest::TempDir::Base::kDisk);
  const int64_t n = 10007;  // not a multiple of anything
  torch::manual_seed(3);
  at::Tensor master = torch::randn({n});
  at::Tensor m = torch::zeros({n}), v = torch::zeros({n});
  at::Tensor param16 = master.to(dtype);

  SwappedAdam swapped(master, options(dir.path(), sub_group, buffers));
  at::Tensor swapped_param = master.to(dtype);
  // Resident: the ring of buffers (3 fp32 arrays of one sub-group each) + one widened gradient.
  const int64_t group = std::min(sub_group, n);
  const int64_t group_bytes = 12 * group + 3 * 64 + 4096;
  EXPECT_LE(swapped.resident_bytes(), std::min<int64_t>(buffers, (n + group - 1) / group) *
                                              group_bytes + 4 * group + 4096);

  for (int64_t step = 1; step <= 4; ++step) {
    at::Tensor grad = torch::randn({n}).to(dtype);
    at::Tensor grad32 = grad.to(torch::kFloat);
    auto hp = hyper(step);
    if (dtype == torch::kFloat) {
      deepspeed::optim::adam_step(master.data_ptr<float>(), grad32.data_ptr<float>(),
                                  m.data_ptr<float>(), v.data_ptr<float>(), n, hp);
      param16 = master.clone();
    } else {
      deepspeed::optim::adam_step(master.data_ptr<float>(), grad32.data_ptr<float>(),
                                  m.data_ptr<float>(), v.data_ptr<float>(), n, hp,
                                  static_cast<uint16_t*>(param16.data_ptr()),
                                  dtype == torch::kHalf ? deepspeed::optim::Half16Kind::FP16
                                                        : deepspeed::optim::Half16Kind::BF16);
    }
    swapped.step(grad, swapped_param, hp);
    ASSERT_TRUE(torch::equal(swapped_param, param16)) << "step " << step;
  }
  auto state = swapped.read_state();
  EXPECT_TRUE(torch::equal(state[0], master));
  EXPECT_TRUE(torch::equal(state[1], m));
  EXPECT_TRUE(torch::equal(state[2], v));
  // Every step read and wrote the whole state once (plus the initial write and read_state).
  EXPECT_EQ(swapped.stats().bytes_read, 4 * swapped.file_bytes());
  EXPECT_EQ(swapped.stats().bytes_written, 5 * swapped.file_bytes());
}

INSTANTIATE_TEST_SUITE_P(
    SubGroupsAndBuffers, SwappedAdamMatchesInMemory,
    ::testing::Values(std::make_tuple(int64_t{1000}, 1, torch::kBFloat16),
                      std::make_tuple(int64_t{1000}, 2, torch::kBFloat16),
                      std::make_tuple(int64_t{1000}, 3, torch::kFloat),
                      std::make_tuple(int64_t{1000}, 4, torch::kHalf),
                      std::make_tuple(int64_t{3000}, 4, torch::kBFloat16),
                      std::make_tuple(int64_t{1} << 30, 4, torch::kFloat)));

// Constants by run of elements (a client optimizer's parameter groups over the partition): each
// sub-group is cut where the runs meet, each part stepped with its run's constants, bit for bit
// the in-memory update of each run. Runs of 1 and of several sub-groups, boundaries inside them.
TEST(SwappedAdam, RunsOfHyperParametersCutTheSubGroups) {
  struct Sink : deepspeed::offload::ParamSink {
    at::Tensor out;
    void* begin_group(int64_t begin, int64_t) override {
      return out.data_ptr<float>() + begin;
    }
    void end_group(int64_t, int64_t) override {}
  };
  dstest::TempDir dir("swapped_adam_test", dstest::TempDir::Base::kDisk);
  const int64_t n = 3001;
  torch::manual_seed(4);
  at::Tensor master = torch::randn({n});
  at::Tensor m = torch::zeros({n}), v = torch::zeros({n});
  SwappedAdam swapped(master, options(dir.path(), 1000, 2));
  Sink sink;
  sink.out = torch::empty({n});
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<deepspeed::optim::AdamHyperRun> runs{{0, 1, hyper(step)},
                                                     {1, 998, hyper(step)},
                                                     {999, 1500, hyper(step)},
                                                     {2499, 502, hyper(step)}};
    runs[1].hyper.lr = 0.0f;
    runs[1].hyper.weight_decay = 0.0f;
    runs[2].hyper.lr = 3e-3f * step;  // a schedule
    runs[2].hyper.beta2 = 0.95f;
    runs[3].hyper.eps = 1e-6f;
    at::Tensor grad = torch::randn({n});
    for (const auto& r : runs)
      deepspeed::optim::adam_step(master.data_ptr<float>() + r.begin,
                                  grad.data_ptr<float>() + r.begin, m.data_ptr<float>() + r.begin,
                                  v.data_ptr<float>() + r.begin, r.numel, r.hyper);
    swapped.step(grad, sink, torch::kFloat, runs);
    ASSERT_TRUE(torch::equal(sink.out, master)) << "step " << step;
  }
  auto state = swapped.read_state();
  EXPECT_TRUE(torch::equal(state[1], m));
  EXPECT_TRUE(torch::equal(state[2], v));
  // Runs that do not cover the partition are refused before any sub-group changes.
  std::vector<deepspeed::optim::AdamHyperRun> short_runs{{0, n - 1, hyper(4)}};
  EXPECT_THROW(swapped.step(torch::zeros({n}), sink, torch::kFloat, short_runs), c10::Error);
  EXPECT_EQ(swapped.groups_updated(), 0);
}

TEST(SwappedAdam, StateRoundTripsThroughWriteAndRead) {
  dstest::TempDir dir("swapped_adam_test", dstest::TempDir::Base::kDisk);
  at::Tensor a = torch::randn({5000}), b = torch::randn({5000}), c = torch::rand({5000});
  SwappedAdam swapped(a, options(dir.path(), 1024, 2));
  swapped.write_state(a, b, c);
  auto s = swapped.read_state();
  EXPECT_TRUE(torch::equal(s[0], a) && torch::equal(s[1], b) && torch::equal(s[2], c));
}

// The swap file is unlinked as soon as it is created: the folder holds nothing to clean up after
// a crash or a kill, while the open file holds the whole state until the optimizer goes.
TEST(SwappedAdam, TheSwapFileHasNoNameInTheFolder) {
  dstest::TempDir dir("swapped_adam_test", dstest::TempDir::Base::kDisk);
  {
    SwappedAdam swapped(torch::ones({100}), options(dir.path(), 64, 2));
    EXPECT_TRUE(fs::is_empty(dir.path()));
    EXPECT_FALSE(fs::exists(swapped.path()));
    const auto open = dstest::unlinked_files_in(dir.path());
    ASSERT_EQ(open.size(), 1u);
    EXPECT_GE(static_cast<int64_t>(fs::file_size(open[0])), swapped.file_bytes());
    EXPECT_CONTAINS(swapped.path(), dir.path() + "/optimizer_swap.");  // for messages
  }
  EXPECT_TRUE(dstest::unlinked_files_in(dir.path()).empty()) << "the file is still open";
}

// A name already in the folder (another job's file: a pid is reused across machines and time)
// is skipped, never truncated or written.
TEST(SwappedAdam, AnotherFileWithItsNameIsLeftAlone) {
  dstest::TempDir dir("swapped_adam_test", dstest::TempDir::Base::kDisk);
  const std::string theirs = "another job's state";
  // The names this process would take next (its counter starts at 0, and this test binary
  // creates far fewer than 200 swap files).
  for (int n = 0; n < 200; ++n)
    dstest::write_bytes(dir / ("optimizer_swap." + std::to_string(::getpid()) + "." +
                               std::to_string(n) + ".bin"),
                        theirs);
  {
    SwappedAdam swapped(torch::ones({100}), options(dir.path(), 64, 2));
    EXPECT_EQ(dstest::unlinked_files_in(dir.path()).size(), 1u);
  }
  size_t files = 0;
  for (const auto& f : fs::directory_iterator(dir.path())) {
    EXPECT_EQ(dstest::read_bytes(f.path()), theirs) << f.path();
    ++files;
  }
  EXPECT_EQ(files, 200u);
}

// A missing nvme_path is made (create_swap_file); one under a regular file cannot be.
TEST(SwappedAdamErrors, NvmePathThatCannotBeMadeIsNamed) {
  dstest::TempDir dir("swapped_adam_test");
  dstest::write_bytes(dir / "file", "x");
  const std::string bad = dir / "file/swap";
  try {
    SwappedAdam swapped(torch::ones({10}), options(bad, 64, 2));
    FAIL() << "expected IOError";
  } catch (const deepspeed::IOError& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nvme_path"), std::string::npos) << e.what();
  }
}

TEST(SwappedAdamErrors, FileTruncatedUnderTheJobStopsTheStepNamingTheFile) {
  dstest::TempDir dir("swapped_adam_test", dstest::TempDir::Base::kDisk);
  const int64_t n = 20000;
  SwappedAdam swapped(torch::ones({n}), options(dir.path(), 4096, 3));
  const auto file = dstest::unlinked_files_in(dir.path());
  ASSERT_EQ(file.size(), 1u);
  ASSERT_EQ(::truncate(file[0].c_str(), swapped.file_bytes() / 2), 0);
  at::Tensor out = torch::zeros({n});
  try {
    swapped.step(torch::ones({n}), out, hyper(1));
    FAIL() << "expected IOError";
  } catch (const deepspeed::IOError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find(swapped.path()), std::string::npos) << what;
    EXPECT_NE(what.find("short read"), std::string::npos) << what;
  }
}

// A full disk is simulated with RLIMIT_FSIZE: the kernel fails the write past the limit (EFBIG)
// exactly where a full device fails it with ENOSPC.
TEST(SwappedAdamErrors, WriteFailureIsAnIOErrorNamingTheFile) {
  dstest::TempDir dir("swapped_adam_test", dstest::TempDir::Base::kDisk);
  struct rlimit old;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto previous = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 64 * 1024;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string what;
  try {
    SwappedAdam swapped(torch::ones({100000}), options(dir.path(), 8192, 2));
  } catch (const deepspeed::IOError& e) {
    what = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, previous);
  ASSERT_FALSE(what.empty()) << "a write past the size limit did not fail";
  EXPECT_NE(what.find(dir.path()), std::string::npos) << what;
  // The constructor threw: no destructor ran, and the partly written file went all the same.
  EXPECT_TRUE(fs::is_empty(dir.path())) << "the failed optimizer left its swap file";
  EXPECT_TRUE(dstest::unlinked_files_in(dir.path()).empty()) << "the file is still open";
}

// Each message names its config key by its full path and the value given (-3, not 0, so the value
// printed is the one passed and not a default).
TEST(SwappedAdamErrors, BadSettingsNameTheKey) {
  dstest::TempDir dir("swapped_adam_test", dstest::TempDir::Base::kDisk);
  const std::string sub_group = dstest::message_of<deepspeed::ConfigError>(
      [&] { SwappedAdam(torch::ones({10}), options(dir.path(), -3, 2)); });
  EXPECT_CONTAINS(sub_group, "zero_optimization.sub_group_size");
  EXPECT_CONTAINS(sub_group, "got -3");
  const std::string buffers = dstest::message_of<deepspeed::ConfigError>(
      [&] { SwappedAdam(torch::ones({10}), options(dir.path(), 8, 0)); });
  EXPECT_CONTAINS(buffers, "zero_optimization.offload_optimizer.buffer_count");
  EXPECT_CONTAINS(buffers, "got 0");
  EXPECT_TRUE(fs::is_empty(dir.path())) << "a refused setting left a swap file";
}

}  // namespace swapped_adam_test
