// torch.save files written without Python (src/checkpoint/torch_save.h): read back by libtorch's
// reader and by Python's torch.load(weights_only=True) equal to the tensors given, every dtype
// and shape; the pickle's integers past 32 bits as Python reads them; a failed write keeping the
// previous file; data that does not match the entries named with the file and tensor.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>

#include <caffe2/serialize/inline_container.h>

#include "checkpoint/fault_injecting_file_system.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/torch_load.h"
#include "checkpoint/torch_save.h"
#include "checkpoint/weights_file.h"
#include "deepspeed/errors.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/torch_save_files.h"

namespace checkpoint_torch_save_test {

namespace ckpt = deepspeed::checkpoint;

// One tensor of every dtype torch.save is written for here, in shapes that matter: 0-dim, empty,
// 3-dim, and one non-contiguous (written as its contiguous copy).
ckpt::NamedTensors every_dtype() {
  torch::manual_seed(3);
  return {{"w.float", torch::randn({2, 3})},
          {"w.bf16", torch::randn({4}).to(torch::kBFloat16)},
          {"w.half", torch::randn({2, 2}).to(torch::kHalf)},
          {"scalar.double", torch::tensor(2.5, torch::kDouble)},
          {"ids.long", torch::tensor({int64_t(1), int64_t(-2), int64_t(3000000000)}, torch::kLong)},
          {"ids.int", torch::arange(4, torch::kInt).view({2, 1, 2})},
          {"ids.short", torch::tensor({-7, 7}, torch::kShort)},
          {"ids.char", torch::tensor({-1, 0, 1}, torch::kChar)},
          {"bytes", torch::arange(5, torch::kByte)},
          {"mask", torch::tensor({true, false, true, true})},
          {"empty", torch::zeros({0, 3})},
          {"transposed", torch::arange(6, torch::kFloat).view({2, 3}).t()}};
}

void expect_same(const ckpt::NamedTensors& got, const ckpt::NamedTensors& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first) << "entry " << i;
    EXPECT_EQ(got[i].second.scalar_type(), want[i].second.scalar_type()) << want[i].first;
    EXPECT_EQ(got[i].second.sizes(), want[i].second.sizes()) << want[i].first;
    EXPECT_TRUE(torch::equal(got[i].second, want[i].second)) << want[i].first;
  }
}

TEST(TorchSave, LibtorchReadsBackEveryDtypeAndShapeInOrder) {
  dstest::TempDir dir;
  const auto tensors = every_dtype();
  ckpt::write_torch_save(ckpt::posix_file_system(), dir / "pytorch_model.bin", tensors);
  expect_same(dstest::read_torch_save(dir / "pytorch_model.bin"), tensors);
}

// Python's own reader, with the restricted unpickler (torch 2.6+'s default): the globals used are
// the allowed ones. 1,010 entries cross the pickle's batches of 1,000 items.
TEST(TorchSave, PythonTorchLoadReadsItWithWeightsOnly) {
  if (!dstest::python_has_torch())
    GTEST_SKIP() << "/usr/bin/python3 with torch (Debian's python3-torch) is not installed";
  dstest::TempDir dir;
  auto tensors = every_dtype();
  tensors.back().second = tensors.back().second.contiguous();  // safetensors takes no strides
  for (int i = 0; i < 998; ++i)
    tensors.emplace_back("layers." + std::to_string(i) + ".bias", torch::full({2}, float(i)));
  auto& fs = ckpt::posix_file_system();
  ckpt::write_torch_save(fs, dir / "pytorch_model.bin", tensors);
  ckpt::write_safetensors(fs, dir / "model.safetensors", tensors);
  const std::string out =
      dstest::python_compare_torch_save(dir / "pytorch_model.bin", dir / "model.safetensors");
  EXPECT_EQ(out.rfind("ok\n", 0), 0u) << out;
  EXPECT_CONTAINS(out, "checked 1010 tensors; 0 mismatches");
}

// Sizes past 32 bits (a 3e9-element tensor's numel and stride) go in the pickle as LONG1;
// checked by Python's plain pickle module on the pickle alone (no tensor data: the globals are
// stood in for, so neither torch nor 12 GB are needed).
TEST(TorchSave, PickleIntegersPast32BitsReadAsPythonReadsThem) {
  if (std::system("/usr/bin/python3 -c 'import pickle' > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "/usr/bin/python3 is not installed";
  dstest::TempDir dir;
  const std::vector<ckpt::SafetensorsEntry> entries = {
      {"huge", torch::kBFloat16, {3, 1000000000}}, {"mid", torch::kFloat, {70000}},
      {"tiny", torch::kFloat, {}}};
  dstest::write_bytes(dir / "data.pkl", ckpt::torch_save_pickle(entries));
  const std::string script = R"(
import pickle, sys
class U(pickle.Unpickler):
    def find_class(self, module, name):
        if name == "_rebuild_tensor_v2":
            return lambda storage, offset, size, stride, *rest: (storage, offset, size, stride)
        return (module + "." + name) if name.endswith("Storage") else dict
    def persistent_load(self, pid):
        return pid
with open(sys.argv[1], "rb") as f:
    for k, (pid, offset, size, stride) in U(f).load().items():
        print(k, pid[1], pid[2], pid[3], pid[4], offset, list(size), list(stride))
)";
  dstest::write_bytes(dir / "read.py", script);
  const std::string log = dir / "py.log";
  const int status = std::system(("/usr/bin/python3 " + (dir / "read.py") + " " +
                                  (dir / "data.pkl") + " > " + log + " 2>&1")
                                     .c_str());
  const std::string out = dstest::read_bytes(log);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  EXPECT_EQ(out,
            "huge torch.BFloat16Storage 0 cpu 3000000000 0 [3, 1000000000] "
            "[1000000000, 1]\n"
            "mid torch.FloatStorage 1 cpu 70000 0 [70000] [1]\n"
            "tiny torch.FloatStorage 2 cpu 1 0 [] []\n");
}

// Any write that fails (here the third append, the first tensor's record) is an IOError naming
// the file, and the file written before stays whole.
TEST(TorchSave, AFailedWriteKeepsThePreviousFile) {
  dstest::TempDir dir;
  const std::string path = dir / "pytorch_model.bin";
  const ckpt::NamedTensors before = {{"w", torch::ones({64, 64})}};
  ckpt::write_torch_save(ckpt::posix_file_system(), path, before);
  const std::string bytes = dstest::read_bytes(path);
  for (int nth : {1, 3, 6}) {
    SCOPED_TRACE("write " + std::to_string(nth));
    ckpt::FaultInjectingFileSystem fs(ckpt::posix_file_system());
    fs.fail_at(ckpt::FsOp::kWrite, nth, ENOSPC);
    const std::string msg = dstest::message_of<deepspeed::IOError>(
        [&] { ckpt::write_torch_save(fs, path, {{"w", torch::zeros({64, 64})}}); });
    EXPECT_CONTAINS(msg, path);
    EXPECT_EQ(dstest::read_bytes(path), bytes);
  }
  expect_same(dstest::read_torch_save(path), before);
}

// A tensor of another shape or dtype than its entry, one too many, one missing, or a dtype with no
// storage class: CheckpointError naming the file and the tensor; nothing replaces the old file.
TEST(TorchSave, DataThatDoesNotMatchTheEntriesIsNamed) {
  dstest::TempDir dir;
  const std::string path = dir / "w.pt";
  auto& fs = ckpt::posix_file_system();
  ckpt::write_torch_save(fs, path, {{"old", torch::ones({1})}});
  const std::vector<ckpt::SafetensorsEntry> entries = {{"a", torch::kFloat, {2, 3}},
                                                       {"b", torch::kBFloat16, {4}}};
  auto write = [&](const std::function<void(ckpt::TorchSaveWriter&)>& fill) {
    return dstest::message_of<deepspeed::CheckpointError>(
        [&] { ckpt::write_torch_save_streamed(fs, path, entries, fill); });
  };
  std::string msg = write([](ckpt::TorchSaveWriter& w) { w.append(torch::zeros({3, 2})); });
  EXPECT_CONTAINS(msg, path);
  EXPECT_CONTAINS(msg, "tensor \"a\"");
  EXPECT_CONTAINS(msg, "[3, 2]");
  msg = write([](ckpt::TorchSaveWriter& w) {
    w.append(torch::zeros({2, 3}));
    w.append(torch::zeros({4}));  // fp32 for a bf16 entry
  });
  EXPECT_CONTAINS(msg, "tensor \"b\"");
  EXPECT_CONTAINS(msg, "BFloat16");
  msg = write([](ckpt::TorchSaveWriter& w) { w.append(torch::zeros({2, 3})); });
  EXPECT_CONTAINS(msg, "tensor \"b\": never written");
  msg = write([](ckpt::TorchSaveWriter& w) {
    w.append(torch::zeros({2, 3}));
    w.append(torch::zeros({4}, torch::kBFloat16));
    w.append(torch::zeros({1}));
  });
  EXPECT_CONTAINS(msg, "past the last");
  msg = dstest::message_of<deepspeed::CheckpointError>([&] {
    ckpt::write_torch_save(fs, path, {{"z", torch::zeros({2}, torch::kComplexFloat)}});
  });
  EXPECT_CONTAINS(msg, path);
  EXPECT_CONTAINS(msg, "tensor \"z\"");
  expect_same(dstest::read_torch_save(path), {{"old", torch::ones({1})}});
}

// Entries that share an earlier entry's storage (a tied parameter's names) are written once: one
// record, both names rebuilt from it, read back equal; sharing with a later entry, or with one of
// another dtype or shape, is refused naming the tensor.
TEST(TorchSave, ASharedStorageIsWrittenOnce) {
  dstest::TempDir dir;
  const std::string path = dir / "tied.bin";
  auto& fs = ckpt::posix_file_system();
  const at::Tensor a = torch::arange(6, torch::kFloat).view({2, 3}), b = torch::ones({4});
  const std::vector<ckpt::SafetensorsEntry> entries = {
      {"a", torch::kFloat, {2, 3}}, {"b", torch::kFloat, {4}}, {"a_too", torch::kFloat, {2, 3}}};
  ckpt::write_torch_save_streamed(
      fs, path, entries,
      [&](ckpt::TorchSaveWriter& w) {
        w.append(a);
        w.append(b);
        w.append(a);
      },
      {0, 1, 0});
  auto file = fs.open_file(path);
  const auto index = ckpt::read_torch_save_index(*file, path);
  EXPECT_EQ(index.find("a_too")->storage_key, "0");
  EXPECT_EQ(index.storage_offsets.size(), 2u);
  EXPECT_FALSE(caffe2::serialize::PyTorchStreamReader(path).hasRecord("data/2"));
  expect_same(dstest::read_torch_save(path), {{"a", a}, {"b", b}, {"a_too", a}});

  for (const ckpt::StorageOwners& bad :
       {ckpt::StorageOwners{0, 0, 0}, ckpt::StorageOwners{2, 1, 2}, ckpt::StorageOwners{0, 1}}) {
    const std::string msg = dstest::message_of<deepspeed::CheckpointError>(
        [&] { ckpt::write_torch_save_streamed(fs, path, entries, [](auto&) {}, bad); });
    EXPECT_CONTAINS(msg, path);
    EXPECT_TRUE(msg.find("cannot share the storage of entry") != std::string::npos ||
                msg.find("storage owners given for 2 of 3") != std::string::npos)
        << msg;
  }
  expect_same(dstest::read_torch_save(path), {{"a", a}, {"b", b}, {"a_too", a}});
}

TEST(TorchSave, TheFormatFollowsTheFileName) {
  EXPECT_EQ(ckpt::weights_format_for("out/model.safetensors"), ckpt::WeightsFormat::safetensors);
  for (const char* name : {"pytorch_model.bin", "w.pt", "w.pth", "weights", "model.safetensors.x"})
    EXPECT_EQ(ckpt::weights_format_for(name), ckpt::WeightsFormat::torch_save) << name;
}

}  // namespace checkpoint_torch_save_test
