// The crash-safe file layer under checkpoints: atomic writes under injected faults and simulated
// kills, CRC32C, manifests and their verification, safetensors bytes (checked against the format
// and against PyTorch reading them).
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <random>
#include <torch/torch.h>

#include "checkpoint/checksum.h"
#include "checkpoint/fault_injecting_file_system.h"
#include "checkpoint/file_system.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "deepspeed/errors.h"
#include "support/expect.h"
#include "support/files.h"

namespace deepspeed::checkpoint {
namespace checkpoint_io_test {

namespace stdfs = std::filesystem;

// A fresh folder on a real file system per test (fsync and rename are what is tested).
class ScratchDirTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return scratch_ / name; }
  std::vector<std::string> names() const { return posix_file_system().list_dir(dir_); }

  dstest::TempDir scratch_{"ckptio", dstest::TempDir::Base::kDisk};
  const std::string dir_ = scratch_.path();
};

using dstest::message_of;

// ---------------------------------------------------------------------------------------------
// CRC32C

uint32_t crc32c_bitwise(const std::string& s) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : s) {
    c ^= b;
    for (int i = 0; i < 8; ++i) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return c ^ 0xFFFFFFFFu;
}

TEST(Checksum, KnownAnswers) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c_extend_portable(0, "123456789", 9), 0xE3069283u);
  EXPECT_EQ(hex_checksum("123456789", 9), "e3069283");
  EXPECT_EQ(crc32c("", 0), 0u);
  // RFC 3720 B.4: 32 bytes of zeros.
  const std::string zeros(32, '\0');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(to_hex32(0x0000ABCDu), "0000abcd");
}

TEST(Checksum, FastAndPortablePathsAgreeWithBitwiseAtEveryLengthAndAlignment) {
  std::mt19937 gen(7);
  std::string data(300, '\0');
  for (auto& c : data) c = char(gen());
  for (size_t start = 0; start < 9; ++start) {
    for (size_t n = 0; start + n <= data.size(); n += (n < 40 ? 1 : 37)) {
      const std::string s = data.substr(start, n);
      const uint32_t want = crc32c_bitwise(s);
      ASSERT_EQ(crc32c(s.data(), n), want) << "start " << start << " n " << n;
      ASSERT_EQ(crc32c_extend_portable(0, s.data(), n), want) << "start " << start << " n " << n;
    }
  }
}

TEST(Checksum, StreamingEqualsOneShot) {
  const std::string s = "The quick brown fox jumps over the lazy dog, twice over for length.";
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    const uint32_t a = crc32c_extend(0, s.data(), cut);
    EXPECT_EQ(crc32c_extend(a, s.data() + cut, s.size() - cut), crc32c(s.data(), s.size()));
  }
}

// ---------------------------------------------------------------------------------------------
// FileSystem and atomic writes

using FileSystemTest = ScratchDirTest;

TEST_F(FileSystemTest, AtomicWriteCreatesAndReplacesWithoutLeavingTempFiles) {
  FileSystem& fs = posix_file_system();
  fs.write_file_atomic(path("a.bin"), "first version");
  EXPECT_EQ(fs.read_file(path("a.bin")), "first version");
  write_file_atomic(path("a.bin"), std::string("v2\0with nul", 11));
  EXPECT_EQ(read_file(path("a.bin")), std::string("v2\0with nul", 11));
  EXPECT_EQ(fs.file_size(path("a.bin")), 11u);
  fs.write_file_atomic(path("empty"), "");
  EXPECT_EQ(fs.read_file(path("empty")), "");
  EXPECT_EQ(names(), (std::vector<std::string>{"a.bin", "empty"}));
}

// A failure of another kind inside `fill` (libtorch's c10::Error: an out-of-memory preparing a
// piece) removes the temporary file too; before, only IOError and deepspeed::Error did.
TEST_F(FileSystemTest, AnyFailureWhileFillingRemovesTheTemporaryFile) {
  FileSystem& fs = posix_file_system();
  fs.write_file_atomic(path("a.bin"), "first version");
  EXPECT_THROW(fs.write_file_atomic(path("a.bin"),
                                    [](WritableFile& f) {
                                      f.append("x", 1);
                                      TORCH_CHECK(false, "out of memory preparing a piece");
                                    }),
               c10::Error);
  EXPECT_EQ(fs.read_file(path("a.bin")), "first version");
  EXPECT_EQ(names(), (std::vector<std::string>{"a.bin"}));
}

TEST_F(FileSystemTest, DirectoriesListingAndRemoval) {
  FileSystem& fs = posix_file_system();
  fs.make_dirs(path("x/y/z"));
  fs.make_dirs(path("x/y/z"));  // existing is fine
  EXPECT_TRUE(fs.exists(path("x/y/z")));
  fs.write_file_atomic(path("x/y/b"), "b");
  fs.write_file_atomic(path("x/y/a"), "a");
  EXPECT_EQ(fs.list_dir(path("x/y")), (std::vector<std::string>{"a", "b", "z"}));
  EXPECT_TRUE(fs.remove(path("x/y/a")));
  EXPECT_FALSE(fs.remove(path("x/y/a")));
  EXPECT_FALSE(fs.exists(path("x/y/a")));
  EXPECT_TRUE(fs.remove(path("x/y/z")));
  // A file in the way of a directory is an error naming it.
  const auto msg = message_of<IOError>([&] { fs.make_dirs(path("x/y/b/c")); });
  EXPECT_NE(msg.find(path("x/y/b")), std::string::npos) << msg;
  const auto msg2 = message_of<IOError>([&] { fs.read_file(path("nope")); });
  EXPECT_NE(msg2.find(path("nope")), std::string::npos) << msg2;
  EXPECT_NE(msg2.find("No such file or directory"), std::string::npos) << msg2;
}

TEST(PathHelpers, ParentJoinAndTempNames) {
  EXPECT_EQ(parent_dir("a/b/c.bin"), "a/b");
  EXPECT_EQ(parent_dir("c.bin"), ".");
  EXPECT_EQ(parent_dir("/c.bin"), "/");
  EXPECT_EQ(join_path("a/", "b"), "a/b");
  EXPECT_EQ(join_path("a", "b"), "a/b");
  EXPECT_TRUE(is_temp_file_name("model.pt.tmp.1234"));
  EXPECT_FALSE(is_temp_file_name("model.pt.tmp."));
  EXPECT_FALSE(is_temp_file_name("model.pt.tmp.12a"));
  EXPECT_FALSE(is_temp_file_name("model.pt"));
}

struct FaultCase {
  FsOp op;
  int nth;
};
void PrintTo(const FaultCase& c, std::ostream* os) { *os << fs_op_name(c.op) << " #" << c.nth; }

class AtomicWriteFault : public ScratchDirTest, public ::testing::WithParamInterface<FaultCase> {};

// Content large enough that the streaming fill appends several times.
void fill_new(WritableFile& f) {
  const std::string chunk(1000, 'n');
  for (int i = 0; i < 3; ++i) f.append(chunk.data(), chunk.size());
}

TEST_P(AtomicWriteFault, FailureBeforeRenameKeepsOldFileAndRemovesTemp) {
  const auto [op, nth] = GetParam();
  posix_file_system().write_file_atomic(path("f"), "old contents");
  FaultInjectingFileSystem fs(posix_file_system());
  fs.fail_at(op, nth, EIO);
  const auto msg = message_of<IOError>([&] { fs.write_file_atomic(path("f"), fill_new); });
  EXPECT_EQ(fs.calls(op), nth);
  EXPECT_NE(msg.find(path("f")), std::string::npos) << msg;
  EXPECT_NE(msg.find("Input/output error"), std::string::npos) << msg;
  EXPECT_NE(msg.find("previous contents"), std::string::npos) << msg;
  EXPECT_EQ(posix_file_system().read_file(path("f")), "old contents");
  EXPECT_EQ(names(), std::vector<std::string>{"f"});
}

TEST_P(AtomicWriteFault, CrashBeforeRenameKeepsOldFileAndLeavesACollectableTemp) {
  const auto [op, nth] = GetParam();
  posix_file_system().write_file_atomic(path("f"), "old contents");
  FaultInjectingFileSystem fs(posix_file_system());
  fs.crash_at(op, nth);
  EXPECT_THROW(fs.write_file_atomic(path("f"), fill_new), SimulatedCrash);
  EXPECT_EQ(posix_file_system().read_file(path("f")), "old contents");
  const auto left = names();
  const bool temp_created = op != FsOp::kCreate;
  EXPECT_EQ(left.size(), temp_created ? 2u : 1u);
  EXPECT_EQ(posix_file_system().remove_stale_temp_files(dir_), temp_created ? 1 : 0);
  EXPECT_EQ(names(), std::vector<std::string>{"f"});
}

INSTANTIATE_TEST_SUITE_P(EachStep, AtomicWriteFault,
                         ::testing::Values(FaultCase{FsOp::kCreate, 1}, FaultCase{FsOp::kWrite, 1},
                                           FaultCase{FsOp::kWrite, 2}, FaultCase{FsOp::kWrite, 3},
                                           FaultCase{FsOp::kSync, 1}, FaultCase{FsOp::kClose, 1},
                                           FaultCase{FsOp::kRename, 1}),
                         [](const auto& info) {
                           std::string n = fs_op_name(info.param.op);
                           n.erase(std::remove(n.begin(), n.end(), ' '), n.end());
                           return n + std::to_string(info.param.nth);
                         });

// A power cut right after the process dies at any step: the file is the old or the new version.
class PowerLossAfterCrash : public ScratchDirTest, public ::testing::WithParamInterface<FaultCase> {};

TEST_P(PowerLossAfterCrash, FileIsOldOrCompleteNeverPartial) {
  const auto [op, nth] = GetParam();
  posix_file_system().write_file_atomic(path("f"), "old contents");
  FaultInjectingFileSystem fs(posix_file_system());
  fs.crash_at(op, nth);
  EXPECT_THROW(fs.write_file_atomic(path("f"), fill_new), SimulatedCrash);
  fs.simulate_power_loss();
  // Every crash point comes before the directory fsync, so the rename is not durable yet.
  EXPECT_EQ(read_file(path("f")), "old contents");
  posix_file_system().remove_stale_temp_files(dir_);
  EXPECT_EQ(names(), std::vector<std::string>{"f"});
}

INSTANTIATE_TEST_SUITE_P(EachStep, PowerLossAfterCrash,
                         ::testing::Values(FaultCase{FsOp::kCreate, 1}, FaultCase{FsOp::kWrite, 2},
                                           FaultCase{FsOp::kSync, 1}, FaultCase{FsOp::kClose, 1},
                                           FaultCase{FsOp::kRename, 1}, FaultCase{FsOp::kSyncDir, 1}),
                         [](const auto& info) {
                           std::string n = fs_op_name(info.param.op);
                           n.erase(std::remove(n.begin(), n.end(), ' '), n.end());
                           return n + std::to_string(info.param.nth);
                         });

TEST_F(FileSystemTest, PowerLossAfterACompletedAtomicWriteKeepsTheNewFile) {
  posix_file_system().write_file_atomic(path("f"), "old contents");
  FaultInjectingFileSystem fs(posix_file_system());
  fs.write_file_atomic(path("f"), fill_new);
  fs.simulate_power_loss();
  EXPECT_EQ(read_file(path("f")), std::string(3000, 'n'));
  EXPECT_EQ(names(), std::vector<std::string>{"f"});
}

// The simulation itself: what the atomic protocol protects against really is lost.
TEST_F(FileSystemTest, PowerLossDropsUnsyncedBytesAndUndoesUnsyncedRenames) {
  posix_file_system().write_file_atomic(path("f"), "old contents");
  FaultInjectingFileSystem fs(posix_file_system());
  auto naive = fs.create_file(path("f"));  // in place, never fsynced
  naive->append("new", 3);
  naive->close();
  auto half = fs.create_file(path("g"));
  half->append("durable", 7);
  half->sync();
  half->append(" lost", 5);
  half->close();
  fs.simulate_power_loss();
  EXPECT_EQ(read_file(path("f")), "");
  EXPECT_EQ(read_file(path("g")), "durable");

  posix_file_system().write_file_atomic(path("f"), "old contents");
  auto tmp = fs.create_file(path("f.new"));
  tmp->append("new", 3);
  tmp->sync();
  tmp->close();
  fs.rename(path("f.new"), path("f"));  // no directory fsync
  EXPECT_EQ(read_file(path("f")), "new");
  fs.simulate_power_loss();
  EXPECT_EQ(read_file(path("f")), "old contents");
  EXPECT_EQ(read_file(path("f.new")), "new");
}

TEST_F(FileSystemTest, DiskFullGivesIOErrorNamingPathAndErrno) {
  posix_file_system().write_file_atomic(path("f"), "old");
  FaultInjectingFileSystem fs(posix_file_system());
  fs.fail_at(FsOp::kWrite, 1, ENOSPC);
  const auto msg = message_of<IOError>([&] { fs.write_file_atomic(path("f"), std::string(4096, 'x')); });
  EXPECT_NE(msg.find(path("f")), std::string::npos) << msg;
  EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
  EXPECT_NE(msg.find("errno 28"), std::string::npos) << msg;
  EXPECT_EQ(posix_file_system().read_file(path("f")), "old");
  EXPECT_EQ(names(), std::vector<std::string>{"f"});
}

TEST_F(FileSystemTest, DirectorySyncFailureAfterRenameSaysNewFileIsInPlace) {
  posix_file_system().write_file_atomic(path("f"), "old");
  FaultInjectingFileSystem fs(posix_file_system());
  fs.fail_at(FsOp::kSyncDir, 1, EIO);
  const auto msg = message_of<IOError>([&] { fs.write_file_atomic(path("f"), "new"); });
  EXPECT_NE(msg.find("new contents are in place"), std::string::npos) << msg;
  EXPECT_EQ(posix_file_system().read_file(path("f")), "new");
  EXPECT_EQ(names(), std::vector<std::string>{"f"});
}

TEST_F(FileSystemTest, CrashAfterRenameLeavesCompleteNewFile) {
  posix_file_system().write_file_atomic(path("f"), "old");
  FaultInjectingFileSystem fs(posix_file_system());
  fs.crash_at(FsOp::kSyncDir, 1);
  EXPECT_THROW(fs.write_file_atomic(path("f"), "new"), SimulatedCrash);
  EXPECT_EQ(posix_file_system().read_file(path("f")), "new");
  EXPECT_EQ(names(), std::vector<std::string>{"f"});
}

TEST_F(FileSystemTest, FaultsCountFromResetAndOnlyTheChosenCallFails) {
  FaultInjectingFileSystem fs(posix_file_system());
  fs.fail_at(FsOp::kRename, 2, EIO);
  fs.write_file_atomic(path("a"), "a");  // rename #1 passes
  EXPECT_THROW(fs.write_file_atomic(path("b"), "b"), IOError);
  fs.write_file_atomic(path("c"), "c");  // rename #3 passes
  EXPECT_EQ(fs.calls(FsOp::kRename), 3);
  fs.reset();
  EXPECT_EQ(fs.calls(FsOp::kRename), 0);
  fs.write_file_atomic(path("b"), "b");
  EXPECT_EQ(names(), (std::vector<std::string>{"a", "b", "c"}));
}

// A real short write, no injection: the file-size limit makes the kernel accept part of a write and
// then refuse with EFBIG, the way a full disk does.
TEST_F(FileSystemTest, RealShortWriteFromTheKernelIsReportedAndCleanedUp) {
  posix_file_system().write_file_atomic(path("f"), "old");
  struct rlimit old_limit;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old_limit;
  small.rlim_cur = 1000;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string msg = message_of<IOError>([&] { write_file_atomic(path("f"), std::string(5000, 'x')); });
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_NE(msg.find(path("f")), std::string::npos) << msg;
  EXPECT_NE(msg.find("File too large"), std::string::npos) << msg;
  EXPECT_EQ(read_file(path("f")), "old");
  EXPECT_EQ(names(), std::vector<std::string>{"f"});
}

// ---------------------------------------------------------------------------------------------
// Manifest

using ManifestTest = ScratchDirTest;

Manifest sample_manifest(const std::string& dir) {
  write_file_atomic(dir + "/model.bin", std::string(4096, 'm'));
  posix_file_system().make_dirs(dir + "/zero");
  write_file_atomic(dir + "/zero/rank_0.bin", "optimizer state of rank 0");
  return make_manifest(posix_file_system(), dir, {"model.bin", "zero/rank_0.bin"},
                       {{"world_size", 2}, {"zero_stage", 1}, {"dtype", "bf16"}, {"version", "0.1.0"}});
}

TEST_F(ManifestTest, DescribesFilesAndRoundTrips) {
  const Manifest m = sample_manifest(dir_);
  ASSERT_EQ(m.files.size(), 2u);
  EXPECT_EQ(m.files.at("model.bin").bytes, 4096u);
  const std::string model(4096, 'm');
  EXPECT_EQ(m.files.at("model.bin").checksum, hex_checksum(model.data(), model.size()));

  const nlohmann::json j = m.to_json();
  EXPECT_EQ(j.at("checksum_algorithm"), "crc32c");
  EXPECT_EQ(j.at("files").at("zero/rank_0.bin").at("bytes"), 25);
  const Manifest back = Manifest::from_json(nlohmann::json::parse(j.dump()), "test");
  EXPECT_EQ(back.files, m.files);
  EXPECT_EQ(back.metadata, m.metadata);

  write_manifest(posix_file_system(), dir_, m);
  const Manifest read = read_manifest(posix_file_system(), dir_);
  EXPECT_EQ(read.files, m.files);
  EXPECT_EQ(read.metadata.at("zero_stage"), 1);
  verify_files(dir_, read);  // intact: no throw
}

TEST_F(ManifestTest, VerifyNamesMissingTruncatedGrownAndCorruptedFiles) {
  const Manifest m = sample_manifest(dir_);
  const std::string model = path("model.bin");

  std::filesystem::resize_file(model, 1000);
  auto msg = message_of<CheckpointError>([&] { verify_files(dir_, m); });
  EXPECT_NE(msg.find(model), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated: 1000 of 4096 bytes"), std::string::npos) << msg;

  std::filesystem::resize_file(model, 5000);
  msg = message_of<CheckpointError>([&] { verify_files(dir_, m); });
  EXPECT_NE(msg.find("has 5000 bytes, expected 4096"), std::string::npos) << msg;

  std::string flipped(4096, 'm');
  flipped[2000] = 'M';
  write_file_atomic(model, flipped);
  msg = message_of<CheckpointError>([&] { verify_files(dir_, m); });
  EXPECT_NE(msg.find(model), std::string::npos) << msg;
  EXPECT_NE(msg.find("corrupted"), std::string::npos) << msg;

  write_file_atomic(model, std::string(4096, 'm'));
  ASSERT_TRUE(posix_file_system().remove(path("zero/rank_0.bin")));
  msg = message_of<CheckpointError>([&] { verify_files(dir_, m); });
  EXPECT_NE(msg.find(path("zero/rank_0.bin")), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
}

TEST_F(ManifestTest, MalformedManifestsAreRejectedWithTheirName) {
  const nlohmann::json good = sample_manifest(dir_).to_json();
  auto reject = [](nlohmann::json j, const std::string& expect) {
    const auto msg = message_of<CheckpointError>([&] { Manifest::from_json(j, "src.json"); });
    EXPECT_NE(msg.find("src.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find(expect), std::string::npos) << msg;
  };
  auto j = good;
  j["checksum_algorithm"] = "md5";
  reject(j, "md5");
  j = good;
  j["files"]["../escape"] = {{"bytes", 1}, {"checksum", "00000000"}};
  reject(j, "../escape");
  j = good;
  j["files"]["/abs"] = {{"bytes", 1}, {"checksum", "00000000"}};
  reject(j, "/abs");
  j = good;
  j["files"]["model.bin"].erase("bytes");
  reject(j, "\"bytes\"");
  j = good;
  j["files"]["model.bin"]["bytes"] = -1;
  reject(j, "non-negative");
  j = good;
  j.erase("format");
  reject(j, "format");

  auto msg = message_of<CheckpointError>([&] { read_manifest(posix_file_system(), path("nowhere")); });
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
  write_file_atomic(path("manifest.json"), "{not json");
  msg = message_of<CheckpointError>([&] { read_manifest(posix_file_system(), dir_); });
  EXPECT_NE(msg.find(path("manifest.json")), std::string::npos) << msg;
  EXPECT_NE(msg.find("not valid JSON"), std::string::npos) << msg;
}

// ---------------------------------------------------------------------------------------------
// safetensors

using SafetensorsTest = ScratchDirTest;

NamedTensors sample_tensors() {
  torch::manual_seed(3);
  return {{"w_f32", torch::randn({3, 5})},
          {"w_bf16", torch::randn({4, 2}).to(torch::kBFloat16)},
          {"step", torch::arange(-3, 7, torch::kLong).reshape({2, 5})},
          {"empty", torch::empty({0, 4})},
          {"empty_too", torch::empty({2, 0}, torch::kLong)},
          {"scalar", torch::tensor(2.5, torch::kDouble)},
          {"half", torch::randn({3}).to(torch::kHalf)},
          {"mask", torch::tensor({true, false, true})},
          {"transposed", torch::arange(6, torch::kFloat).reshape({2, 3}).t()}};
}

TEST_F(SafetensorsTest, RoundTripKeepsOrderDtypesShapesValuesAndMetadata) {
  const NamedTensors in = sample_tensors();
  write_safetensors(path("m.safetensors"), in, {{"format", "pt"}, {"stage", "2"}});
  const SafetensorsFile out = read_safetensors(path("m.safetensors"));
  ASSERT_EQ(out.tensors.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    SCOPED_TRACE(in[i].first);
    EXPECT_EQ(out.tensors[i].first, in[i].first);
    EXPECT_EQ(out.tensors[i].second.scalar_type(), in[i].second.scalar_type());
    EXPECT_EQ(out.tensors[i].second.sizes(), in[i].second.sizes());
    EXPECT_TRUE(torch::equal(out.tensors[i].second, in[i].second));
  }
  EXPECT_EQ(out.metadata, (SafetensorsMetadata{{"format", "pt"}, {"stage", "2"}}));
  EXPECT_EQ(names(), std::vector<std::string>{"m.safetensors"});
}

TEST_F(SafetensorsTest, HeaderBytesFollowTheFormat) {
  const auto a = torch::tensor({1.0f, -2.0f});
  const NamedTensors tensors = {{"a", a}, {"b", torch::zeros({0}, torch::kLong)}, {"c", torch::ones({1, 1}, torch::kBFloat16)}};
  write_safetensors(path("h.safetensors"), tensors, {{"k", "v"}});
  const std::string bytes = read_file(path("h.safetensors"));

  const std::string json =
      R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"I64","shape":[0],"data_offsets":[8,8]},)"
      R"("c":{"dtype":"BF16","shape":[1,1],"data_offsets":[8,10]}})";
  const size_t padded = (json.size() + 7) / 8 * 8;
  ASSERT_EQ(bytes.size(), 8 + padded + 10);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(bytes[i]);
  EXPECT_EQ(n, padded);
  EXPECT_EQ(bytes.substr(8, padded), json + std::string(padded - json.size(), ' '));
  EXPECT_EQ(bytes.substr(0, 8 + padded), safetensors_header(tensors, {{"k", "v"}}));
  const float want[2] = {1.0f, -2.0f};
  EXPECT_EQ(bytes.substr(8 + padded, 8), std::string(reinterpret_cast<const char*>(want), 8));
  EXPECT_EQ(bytes.substr(8 + padded + 8), std::string("\x80\x3f", 2));  // bf16 1.0
}

TEST_F(SafetensorsTest, TruncatedOrInconsistentFilesAreRejectedNamingFileAndTensor) {
  const std::string file = path("t.safetensors");
  write_safetensors(file, {{"a", torch::ones({4})}, {"b", torch::ones({16})}});
  const auto full = stdfs::file_size(file);

  stdfs::resize_file(file, full - 4);
  auto msg = message_of<CheckpointError>([&] { read_safetensors(file); });
  EXPECT_NE(msg.find(file), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"b\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;

  stdfs::resize_file(file, 20);  // cut inside the header
  msg = message_of<CheckpointError>([&] { read_safetensors(file); });
  EXPECT_NE(msg.find("header length"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;

  stdfs::resize_file(file, 3);
  msg = message_of<CheckpointError>([&] { read_safetensors(file); });
  EXPECT_NE(msg.find("too short"), std::string::npos) << msg;

  auto handmade = [&](const std::string& json, size_t data_bytes) {
    std::string s(8, '\0');
    s[0] = char(json.size());
    write_file_atomic(file, s + json + std::string(data_bytes, '\0'));
    return message_of<CheckpointError>([&] { read_safetensors(file); });
  };
  msg = handmade(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8);
  EXPECT_NE(msg.find("\"x\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("need 12"), std::string::npos) << msg;
  msg = handmade(R"({"x":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", 1);
  EXPECT_NE(msg.find("unsupported dtype"), std::string::npos) << msg;
  msg = handmade(R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", 4);
  EXPECT_NE(msg.find("back to back"), std::string::npos) << msg;
  msg = handmade(R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 5);
  EXPECT_NE(msg.find("cover 2"), std::string::npos) << msg;
  msg = handmade(R"({"x":{"dtype":"U8","shape":[-2],"data_offsets":[0,2]}})", 2);
  EXPECT_NE(msg.find("bad dimension"), std::string::npos) << msg;
  msg = handmade("[1,2]", 0);
  EXPECT_NE(msg.find("JSON object"), std::string::npos) << msg;
  msg = handmade("{oops", 0);
  EXPECT_NE(msg.find("not valid JSON"), std::string::npos) << msg;
}

// Each refusal names the file, the tensor and what is wrong with it.
TEST_F(SafetensorsTest, BadNamesAndDtypesAreRefusedBeforeWriting) {
  EXPECT_CONTAINS(message_of<CheckpointError>([&] {
                    write_safetensors(path("x"), {{"a", torch::ones({1})}, {"a", torch::ones({1})}});
                  }),
                  "safetensors '" + path("x") + "': tensor name \"a\" is used twice");
  EXPECT_CONTAINS(message_of<CheckpointError>([&] {
                    write_safetensors(path("x"), {{"__metadata__", torch::ones({1})}});
                  }),
                  "tensor name \"__metadata__\" is reserved");
  const std::string complex = message_of<CheckpointError>([&] {
    write_safetensors(path("x"), {{"c", torch::ones({1}, torch::kComplexFloat)}});
  });
  EXPECT_CONTAINS(complex, "safetensors '" + path("x") + "': tensor \"c\"");
  EXPECT_CONTAINS(complex, "dtype ComplexFloat cannot be stored in safetensors");
  EXPECT_TRUE(names().empty());
}

TEST_F(SafetensorsTest, WriteFaultKeepsThePreviousFile) {
  write_safetensors(path("m.safetensors"), {{"v", torch::full({8}, 1.0f)}});
  FaultInjectingFileSystem fs(posix_file_system());
  fs.fail_at(FsOp::kWrite, 2, ENOSPC);  // the header goes through, the data does not
  EXPECT_THROW(write_safetensors(fs, path("m.safetensors"), {{"v", torch::full({8}, 2.0f)}}), IOError);
  const auto back = read_safetensors(path("m.safetensors"));
  EXPECT_TRUE(torch::equal(back.tensors.at(0).second, torch::full({8}, 1.0f)));
  EXPECT_EQ(names(), std::vector<std::string>{"m.safetensors"});
}

// PyTorch, reading the bytes on its own (no safetensors package), must see the same tensors.
TEST_F(SafetensorsTest, PyTorchReadsTheFileWithoutTheSafetensorsPackage) {
  const char* python = "/usr/bin/python3";
  if (::access(python, X_OK) != 0) GTEST_SKIP() << python << " is not installed";
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << python << " cannot import torch (Debian package python3-torch)";
  }
  const NamedTensors in = sample_tensors();
  write_safetensors(path("m.safetensors"), in, {{"format", "pt"}});
  const std::string script = R"(
import json, struct, sys, torch
dtypes = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64,
          "I64": torch.int64, "BOOL": torch.bool}
raw = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
assert (8 + n) % 8 == 0, "header not padded to 8"
header = json.loads(raw[8:8 + n].decode("utf-8"))
data = bytearray(raw[8 + n:])
out = {"__metadata__": header.pop("__metadata__", None), "order": [], "tensors": {}}
for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
    b, e = info["data_offsets"]
    dt = dtypes[info["dtype"]]
    if e > b:
        t = torch.frombuffer(data[b:e], dtype=dt).reshape(info["shape"])
    else:
        t = torch.empty(info["shape"], dtype=dt)
    out["order"].append(name)
    out["tensors"][name] = {"shape": list(t.shape), "values": t.double().flatten().tolist()}
print(json.dumps(out))
)";
  write_file_atomic(path("read.py"), script);
  const std::string cmd = std::string(python) + " " + path("read.py") + " " + path("m.safetensors");
  FILE* pipe = ::popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, pipe)) output.append(buf, n);
  ASSERT_EQ(::pclose(pipe), 0) << output;
  const auto got = nlohmann::json::parse(output);

  EXPECT_EQ(got.at("__metadata__"), (nlohmann::json{{"format", "pt"}}));
  ASSERT_EQ(got.at("order").size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const auto& [name, t] = in[i];
    SCOPED_TRACE(name);
    EXPECT_EQ(got.at("order")[i], name);
    const auto& pt = got.at("tensors").at(name);
    EXPECT_EQ(pt.at("shape").get<std::vector<int64_t>>(), t.sizes().vec());
    const auto values = pt.at("values").get<std::vector<double>>();
    const auto want = t.to(torch::kDouble).contiguous().flatten();
    ASSERT_EQ(int64_t(values.size()), want.numel());
    for (int64_t k = 0; k < want.numel(); ++k) EXPECT_EQ(values[k], want[k].item<double>()) << "element " << k;
  }
}

}  // namespace checkpoint_io_test
}  // namespace deepspeed::checkpoint
