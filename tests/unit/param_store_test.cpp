// ZeRO-3 parameter partition store (offload_param): what is written to a unit's slice comes back
// from fetch / read_all whether the unit is in memory or in the swap file; prefetch reads are
// bounded by buffer_count; sub-groups never straddle file units; the optimizer's sink writes land
// in the right place; a file truncated under the job is an IOError naming it, never stale numbers.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "deepspeed/errors.h"
#include "deepspeed/zero_unit.h"
#include "offload/param_store.h"
#include "optim/fused_adam.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/stage3_layouts.h"
#include "support/swap_files.h"

namespace param_store_test {

namespace fs = std::filesystem;
using deepspeed::offload::ParamStore;
using deepspeed::zero::Stage3Layout;
using deepspeed::ZeroUnitBase;

namespace {

// A root of 10 elements and units of 5000, 9000 and 3 elements (world size 1).
Stage3Layout layout() { return dstest::one_rank_layout({10, 5000, 9000, 3}); }

deepspeed::ZeroConfig zero(const std::string& device, const fs::path& dir, int64_t max_in_cpu) {
  deepspeed::ZeroConfig z;
  z.stage = 3;
  z.offload_param.device = device;
  z.offload_param.nvme_path = dir.string();
  z.offload_param.max_in_cpu = max_in_cpu;
  z.offload_param.buffer_count = 2;
  z.offload_param.buffer_size = 10000;
  return z;
}

// A ZeroUnit over a plain module holding 1-D parameters of the given names and sizes.
std::shared_ptr<ZeroUnitBase> unit_of(const std::vector<std::pair<std::string, int64_t>>& params) {
  auto inner = std::make_shared<torch::nn::Module>();
  for (const auto& [name, numel] : params) inner->register_parameter(name, torch::zeros({numel}));
  return std::make_shared<deepspeed::ZeroUnit<std::shared_ptr<torch::nn::Module>>>(inner);
}

// The stage's layout of these units (every parameter in its unit: none persistent).
Stage3Layout layout_of(const std::vector<std::shared_ptr<ZeroUnitBase>>& units, int world) {
  std::vector<ZeroUnitBase*> modules;
  std::vector<at::Tensor> trainable;
  for (const auto& u : units) {
    modules.push_back(u.get());
    for (const auto& p : u->parameters()) trainable.push_back(p);
  }
  deepspeed::ZeroConfig z;
  z.stage3_param_persistence_threshold = 0;
  return deepspeed::zero::make_stage3_layout(modules, trainable, world, z);
}

}  // namespace

TEST(ParamStore, SlicesRoundTripInMemoryAndInTheFile) {
  dstest::TempDir dir("param_store_test", dstest::TempDir::Base::kDisk);
  const Stage3Layout L = layout();
  ParamStore store(L, torch::kBFloat16, zero("nvme", dir.path(), 5000), dstest::small_aio());
  ASSERT_TRUE(store.swapped());
  EXPECT_TRUE(store.in_memory(0) && store.in_memory(1));
  EXPECT_FALSE(store.in_memory(2) || store.in_memory(3));
  EXPECT_EQ(store.memory().numel(), 5010);
  EXPECT_EQ(store.file_bytes(), 20480 + 4096);  // each file slice padded to 4096 bytes

  at::Tensor all = torch::randn({L.partition_numel}).to(torch::kBFloat16);
  store.write_all(all);
  EXPECT_TRUE(torch::equal(store.read_all(), all));
  for (int u = 0; u < 4; ++u) {
    auto want = all.narrow(0, L.units[u].partition_offset, L.units[u].layout.partition_numel);
    EXPECT_TRUE(torch::equal(store.fetch(u), want)) << "unit " << u;
    store.done(u);
  }
  at::Tensor two = torch::full({9000}, 3.0).to(torch::kBFloat16);
  store.write(2, two);
  EXPECT_TRUE(torch::equal(store.fetch(2), two));
}

TEST(ParamStore, PrefetchIsBoundedByBufferCount) {
  dstest::TempDir dir("param_store_test", dstest::TempDir::Base::kDisk);
  const Stage3Layout L = layout();
  ParamStore store(L, torch::kFloat, zero("nvme", dir.path(), 0), dstest::small_aio());
  const int64_t memory = store.resident_bytes();
  EXPECT_TRUE(store.start_fetch(1));
  EXPECT_TRUE(store.start_fetch(2));
  EXPECT_FALSE(store.start_fetch(3)) << "a third buffer with buffer_count 2";
  // Two pool buffers, each the size of the largest file slice (unit 2's 9000 elements).
  EXPECT_EQ(store.resident_bytes(), memory + 2 * 9000 * 4);
  store.done(1);
  EXPECT_TRUE(store.start_fetch(3));
  store.done(2);
  store.done(3);
  EXPECT_EQ(store.resident_bytes(), memory + 2 * 9000 * 4) << "the pool is kept";
}

// A copy's fence, as a GPU upload on a side stream would give: counts the waits for it.
struct CountedFence : deepspeed::device::CopyFence {
  int waits = 0;
  void wait() override { ++waits; }
  bool passed() override { return waits > 0; }
  void join_current() override {}
};

// A buffer handed back with a copy still reading it is reused only after waiting for that copy;
// past buffer_count, fetch() reads into a one-off, freed (after its readers) at done().
TEST(ParamStore, SliceBuffersAreReusedOnlyAfterTheirReaders) {
  dstest::TempDir dir("param_store_test", dstest::TempDir::Base::kDisk);
  const Stage3Layout L = layout();
  ParamStore store(L, torch::kFloat, zero("nvme", dir.path(), 0), dstest::small_aio());
  const int64_t memory = store.resident_bytes();
  at::Tensor all = torch::randn({L.partition_numel});
  store.write_all(all);
  auto want = [&](int u) {
    return all.narrow(0, L.units[u].partition_offset, L.units[u].layout.partition_numel);
  };
  void* first = store.fetch(1).data_ptr();
  EXPECT_TRUE(torch::equal(store.fetch(2), want(2)));  // the second pool buffer: the pool is full
  auto upload = std::make_shared<CountedFence>();
  store.done(1, upload);
  EXPECT_EQ(upload->waits, 0) << "done() does not wait";
  at::Tensor three = store.fetch(3);
  EXPECT_EQ(upload->waits, 1) << "the buffer's reader is waited for before the read into it";
  EXPECT_EQ(three.data_ptr(), first) << "the pool buffer is reused";
  EXPECT_TRUE(torch::equal(three, want(3)));
  EXPECT_TRUE(torch::equal(store.fetch(1), want(1)));  // a one-off: both pool buffers are held
  EXPECT_EQ(store.resident_bytes(), memory + 2 * 9000 * 4 + 5000 * 4);
  auto late = std::make_shared<CountedFence>();
  store.done(1, late);
  EXPECT_EQ(late->waits, 1) << "a one-off is freed only after its readers";
  store.done(2);
  store.done(3);
  EXPECT_EQ(store.resident_bytes(), memory + 2 * 9000 * 4);
}

// A slice fetched and not handed back (a gather in flight reads it; on a GPU, an upload) is never
// recycled by the store's own reads and writes: before read_all or write touches it, the store
// has its holder hand it back (set_hand_back), and without a holder that can, it refuses, naming
// the unit. Before, read_all gave the held buffer to the next unit's read.
TEST(ParamStore, AHeldSliceIsHandedBackBeforeTheStoreRecyclesIt) {
  dstest::TempDir dir("param_store_test", dstest::TempDir::Base::kDisk);
  const Stage3Layout L = layout();
  auto config = zero("nvme", dir.path(), 0);
  config.offload_param.buffer_count = 1;  // one pool buffer: a recycled one is the held one
  ParamStore store(L, torch::kFloat, config, dstest::small_aio());
  at::Tensor all = torch::randn({L.partition_numel});
  store.write_all(all);
  auto want = [&](int u) {
    return all.narrow(0, L.units[u].partition_offset, L.units[u].layout.partition_numel);
  };
  at::Tensor held = store.fetch(2);  // the pool buffer
  ASSERT_TRUE(torch::equal(held, want(2)));

  EXPECT_CONTAINS(dstest::message_of<std::logic_error>([&] { store.read_all(); }),
                  "unit 2 is still held");
  EXPECT_THROW(store.write(2, torch::zeros({9000})), std::logic_error);
  at::Tensor three = torch::full({3}, 5.0);
  store.write(3, three);  // another unit's slice: the held one is not touched
  all.narrow(0, L.units[3].partition_offset, 3).copy_(three);
  EXPECT_TRUE(torch::equal(held, want(2))) << "the held buffer was written";

  int hand_backs = 0;
  std::vector<int> holding = {2};
  auto upload = std::make_shared<CountedFence>();
  store.set_hand_back([&] {  // as the gatherer's: each gather in flight hands its slice back
    ++hand_backs;
    for (int u : holding) store.done(u, upload);
    holding.clear();
  });
  EXPECT_TRUE(torch::equal(store.read_all(), all));
  EXPECT_EQ(hand_backs, 1);
  EXPECT_EQ(upload->waits, 1) << "the pool buffer is reused only after the holder's copy";
  EXPECT_TRUE(torch::equal(store.read_all(), all));
  EXPECT_EQ(hand_backs, 1) << "nothing held: no hand-back";

  held = store.fetch(1);
  holding = {1};
  at::Tensor one = torch::full({5000}, 2.0);
  store.write(1, one);  // the holder hands it back first
  EXPECT_EQ(hand_backs, 2);
  EXPECT_TRUE(torch::equal(store.fetch(1), one));
}

TEST(ParamStore, SinkWritesEachSubGroupInPlace) {
  dstest::TempDir dir("param_store_test", dstest::TempDir::Base::kDisk);
  const Stage3Layout L = layout();
  ParamStore store(L, torch::kBFloat16, zero("nvme", dir.path(), 0), dstest::small_aio());
  auto groups = deepspeed::offload::unit_aligned_groups(L, 3000);
  // Cut at unit ends and every 4096 elements inside a unit.
  std::vector<std::pair<int64_t, int64_t>> want = {
      {0, 10}, {10, 4096}, {4106, 904}, {5010, 4096}, {9106, 4096}, {13202, 808}, {14010, 3}};
  EXPECT_EQ(groups, want);
  at::Tensor all = torch::randn({L.partition_numel}).to(torch::kBFloat16);
  for (auto [begin, n] : groups) {
    void* out = store.begin_group(begin, n);
    std::memcpy(out, static_cast<char*>(all.data_ptr()) + begin * 2, n * 2);
    store.end_group(begin, n);
  }
  store.finish();
  EXPECT_TRUE(torch::equal(store.read_all(), all));
  EXPECT_TRUE(torch::equal(store.read_group(9106, 4096), all.narrow(0, 9106, 4096)));
}

// The sink's two staging buffers for file units stay for the store's life: resident_bytes()
// counts them (before, it left them out of the memory report).
TEST(ParamStore, ResidentBytesCountTheSinkStaging) {
  dstest::TempDir dir("param_store_test", dstest::TempDir::Base::kDisk);
  const Stage3Layout L = layout();
  ParamStore store(L, torch::kBFloat16, zero("nvme", dir.path(), 0), dstest::small_aio());
  const int64_t before = store.resident_bytes();
  at::Tensor all = torch::randn({L.partition_numel}).to(torch::kBFloat16);
  for (auto [begin, n] : deepspeed::offload::unit_aligned_groups(L, 3000)) {
    std::memcpy(store.begin_group(begin, n), static_cast<char*>(all.data_ptr()) + begin * 2, n * 2);
    store.end_group(begin, n);
  }
  store.finish();
  // Each staging buffer grew to the largest sub-group it took: 4096 bf16 elements.
  EXPECT_EQ(store.resident_bytes(), before + 2 * 4096 * 2);
  EXPECT_EQ(store.host_bytes(), store.resident_bytes()) << "all of it is host memory";
  EXPECT_TRUE(torch::equal(store.read_all(), all));
}

// The shard optimizer's masters stay where they were on the CPU: offload_param "cpu" with the
// optimizer in memory steps masters aliased to the fp32 partition, or (bf16) an fp32 copy in host
// memory. (On a GPU they now live on the GPU: tests/gpu/gpu_training_test.cpp.)
TEST(ParamStore, CpuOffloadParamKeepsTheMastersInHostMemoryOnTheCpu) {
  dstest::TempDir dir("param_store_test", dstest::TempDir::Base::kDisk);
  const Stage3Layout L = layout();
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    ParamStore store(L, dtype, zero("cpu", dir.path(), 0), dstest::small_aio());
    at::Tensor start = torch::randn({L.partition_numel}).to(dtype);
    store.write_all(start);
    deepspeed::zero::ShardOptions options;  // home none, compute device the CPU
    auto shard =
        deepspeed::zero::make_shard_optimizer(options, store, [](std::vector<at::Tensor> p) {
          return std::make_shared<deepspeed::optim::FusedAdam>(std::move(p),
                                                               deepspeed::AdamHyper{});
        });
    at::Tensor master = shard->state_for_save()[0];
    EXPECT_TRUE(master.is_cpu());
    if (dtype == torch::kFloat)
      EXPECT_EQ(master.data_ptr(), store.memory().data_ptr()) << "the fp32 partition is the master";
    shard->step({torch::ones({L.partition_numel}).to(dtype)}, store, 1.0);
    EXPECT_FALSE(torch::equal(store.read_all(), start)) << "the step reached the store";
    EXPECT_TRUE(torch::equal(store.read_all(), master.to(dtype)));
    EXPECT_EQ(shard->resident_host_bytes(), shard->resident_bytes());
  }
}

TEST(ParamStore, NoneAndCpuKeepEverythingInMemory) {
  dstest::TempDir dir("param_store_test", dstest::TempDir::Base::kDisk);
  const Stage3Layout L = layout();
  for (const char* device : {"none", "cpu"}) {
    ParamStore store(L, torch::kFloat, zero(device, dir.path(), 0), dstest::small_aio());
    EXPECT_FALSE(store.swapped());
    EXPECT_EQ(store.memory().numel(), L.partition_numel);
    EXPECT_EQ(store.fetch(2).data_ptr(), store.memory().narrow(0, 5010, 9000).data_ptr());
  }
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

TEST(ParamStoreErrors, FileTruncatedUnderTheJobIsAnIOErrorNamingIt) {
  dstest::TempDir dir("param_store_test", dstest::TempDir::Base::kDisk);
  const Stage3Layout L = layout();
  ParamStore store(L, torch::kFloat, zero("nvme", dir.path(), 0), dstest::small_aio());
  store.write_all(torch::ones({L.partition_numel}));
  const auto file = dstest::unlinked_files_in(dir.path());
  ASSERT_EQ(file.size(), 1u);
  const std::string whole = dstest::read_bytes(file[0]);
  ASSERT_EQ(::truncate(file[0].c_str(), 4096), 0);
  try {
    store.fetch(2);
    FAIL() << "expected IOError";
  } catch (const deepspeed::IOError& e) {
    EXPECT_NE(std::string(e.what()).find(store.path()), std::string::npos) << e.what();
  }
  // The failed read is not remembered as fetched: once the file is whole again, the unit is
  // read again (before, the half-read buffer was handed out as its slice).
  dstest::write_bytes(file[0], whole);
  EXPECT_TRUE(torch::equal(store.fetch(2), torch::ones({9000})));
}

TEST(ParamStoreErrors, SliceLargerThanBufferSizeNamesTheKey) {
  dstest::TempDir dir("param_store_test", dstest::TempDir::Base::kDisk);
  auto z = zero("nvme", dir.path(), 0);
  z.offload_param.buffer_size = 8999;
  try {
    ParamStore store(layout(), torch::kFloat, z, dstest::small_aio());
    FAIL() << "expected ConfigError";
  } catch (const deepspeed::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("offload_param.buffer_size"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("9000"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

// buffer_size bounds each parameter's partition, ceil(numel / world size) elements, with
// DeepSpeed's strict comparison (its swapper asserts numel < buffer_size per parameter), not a
// unit's whole slice: before, a unit of two 6000-element parameters was refused at 8000.
TEST(ParamStoreErrors, BufferSizeBoundsEachParameterNotTheUnit) {
  dstest::TempDir dir("param_store_test", dstest::TempDir::Base::kDisk);
  auto z = zero("nvme", dir.path(), 0);
  z.offload_param.buffer_size = 8000;
  const std::vector<std::shared_ptr<ZeroUnitBase>> two = {unit_of({{"a", 6000}, {"b", 6000}})};
  const Stage3Layout pair = layout_of(two, 1);
  ParamStore store(pair, torch::kFloat, z, dstest::small_aio());
  EXPECT_TRUE(store.swapped());

  const std::vector<std::shared_ptr<ZeroUnitBase>> big = {unit_of({{"small", 10}, {"big", 9000}})};
  const Stage3Layout one_rank = layout_of(big, 1);
  const std::string msg = dstest::message_of<deepspeed::ConfigError>(
      [&] { ParamStore(one_rank, torch::kFloat, z, dstest::small_aio()); });
  EXPECT_CONTAINS(msg, "zero_optimization.offload_param.buffer_size is 8000");
  EXPECT_CONTAINS(msg, "'big' (9000 elements)");
  EXPECT_CONTAINS(msg, "the 9000 elements of this rank's partition");
  EXPECT_CONTAINS(msg, "at least 9001");

  // At world size 2 its partition is 4500 elements.
  const Stage3Layout two_ranks = layout_of(big, 2);
  EXPECT_NO_THROW(ParamStore(two_ranks, torch::kFloat, z, dstest::small_aio()));
  // Equal is refused, as DeepSpeed's assert.
  z.offload_param.buffer_size = 6000;
  EXPECT_CONTAINS(dstest::message_of<deepspeed::ConfigError>(
                      [&] { ParamStore(pair, torch::kFloat, z, dstest::small_aio()); }),
                  "'a' (6000 elements)");
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

// buffer_count 0 is a valid key (DeepSpeed: >= 0) as long as nothing is swapped.
TEST(ParamStoreErrors, BufferCountZeroOnlyWhenUnitsAreSwapped) {
  dstest::TempDir dir("param_store_test", dstest::TempDir::Base::kDisk);
  auto z = zero("cpu", dir.path(), 0);
  z.offload_param.buffer_count = 0;
  EXPECT_NO_THROW(ParamStore(layout(), torch::kFloat, z, dstest::small_aio()));
  z.offload_param.device = "nvme";
  z.offload_param.max_in_cpu = 1000000;  // every unit in memory
  EXPECT_NO_THROW(ParamStore(layout(), torch::kFloat, z, dstest::small_aio()));
  z.offload_param.max_in_cpu = 0;
  EXPECT_CONTAINS(dstest::message_of<deepspeed::ConfigError>(
                      [&] { ParamStore(layout(), torch::kFloat, z, dstest::small_aio()); }),
                  "offload_param.buffer_count must be >= 1");
}

// nvme_path is made when missing (parents too), as DeepSpeed's os.makedirs(exist_ok=True); one
// that cannot be made is an IOError naming the key, the path and the OS's reason.
TEST(ParamStoreErrors, MissingNvmePathIsMadeAndOneThatCannotBeIsNamed) {
  dstest::TempDir dir("param_store_test", dstest::TempDir::Base::kDisk);
  const fs::path made = fs::path(dir.path()) / "new" / "sub";
  const Stage3Layout L = layout();
  {
    ParamStore store(L, torch::kFloat, zero("nvme", made, 0), dstest::small_aio());
    EXPECT_TRUE(store.swapped());
    store.write_all(torch::ones({L.partition_numel}));
    EXPECT_TRUE(torch::equal(store.fetch(2), torch::ones({9000})));
  }
  EXPECT_TRUE(fs::is_directory(made));
  dstest::write_bytes(dir / "file", "x");
  const fs::path blocked = fs::path(dir.path()) / "file" / "sub";
  const std::string msg = dstest::message_of<deepspeed::IOError>(
      [&] { ParamStore(L, torch::kFloat, zero("nvme", blocked, 0), dstest::small_aio()); });
  EXPECT_CONTAINS(msg, "zero_optimization.offload_param.nvme_path");
  EXPECT_CONTAINS(msg, blocked.string());
  EXPECT_CONTAINS(msg, "Not a directory");
}

// A store whose construction fails once its swap file exists (here: the I/O queue refuses its
// settings) leaves nothing in the folder: no destructor runs for it, but the file was unlinked
// when it was created.
TEST(ParamStoreErrors, AStoreThatFailsToStartLeavesNoFile) {
  dstest::TempDir dir("param_store_test", dstest::TempDir::Base::kDisk);
  auto aio = dstest::small_aio();
  aio.block_size = 1000;  // not a multiple of 4096: the I/O queue refuses it (the config earlier)
  EXPECT_THROW(ParamStore(layout(), torch::kFloat, zero("nvme", dir.path(), 0), aio),
               deepspeed::ConfigError);
  EXPECT_TRUE(fs::is_empty(dir.path())) << "the failed store left its swap file";
  EXPECT_TRUE(dstest::unlinked_files_in(dir.path()).empty()) << "the file is still open";
}

}  // namespace param_store_test
