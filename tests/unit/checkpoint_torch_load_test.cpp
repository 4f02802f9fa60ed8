// Reading torch.save state dicts without Python (src/checkpoint/torch_load.h,
// state_dict_pickle.h, deepspeed/state_dict_file.h): our own files whole and by range; files
// PyTorch wrote (an OrderedDict with _metadata, tied names sharing a storage, protocol 4, a
// Parameter, views at a storage offset and with strides, the latter sliced by init_inference's
// reader); and what must be refused, named: a global that could run code, a nested checkpoint, a
// file that is no zip, a truncated one.
#include <gtest/gtest.h>

#include <caffe2/serialize/inline_container.h>

#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>

#include "checkpoint/torch_load.h"
#include "checkpoint/torch_save.h"
#include "deepspeed/errors.h"
#include "deepspeed/state_dict_file.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/torch_save_files.h"
#include "tp/shard_loader.h"

namespace checkpoint_torch_load_test {

namespace ckpt = deepspeed::checkpoint;

// A zip archive as torch.save lays it out, holding `pickle` as data.pkl and `records` as
// data/<key>: for pickles PyTorch would not write.
void write_archive(const std::string& path, const std::string& pickle,
                   const std::vector<std::pair<std::string, std::string>>& records = {}) {
  caffe2::serialize::PyTorchStreamWriter writer(path);
  writer.writeRecord("data.pkl", pickle.data(), pickle.size());
  for (const auto& [key, bytes] : records)
    writer.writeRecord("data/" + key, bytes.data(), bytes.size());
  writer.writeEndOfFile();
}

std::string load_error(const std::string& path) {
  return dstest::message_of<deepspeed::CheckpointError>(
      [&] { deepspeed::load_state_dict_file(path); });
}

TEST(TorchLoad, ReadsItsOwnFilesWholeAndByRange) {
  dstest::TempDir dir;
  const ckpt::NamedTensors tensors = {
      {"w", torch::arange(6, torch::kFloat).view({2, 3})},
      {"b", torch::arange(4, torch::kFloat).to(torch::kBFloat16)},
      {"ids", torch::tensor({int64_t(5), int64_t(-6)})},
      {"mask", torch::tensor({true, false})},
      {"empty", torch::zeros({0, 4})}};
  const std::string path = dir / "pytorch_model.bin";
  ckpt::write_torch_save(ckpt::posix_file_system(), path, tensors);
  const auto back = deepspeed::load_state_dict_file(path);
  ASSERT_EQ(back.size(), tensors.size());
  for (size_t i = 0; i < back.size(); ++i) {
    EXPECT_EQ(back[i].first, tensors[i].first);
    EXPECT_TRUE(torch::equal(back[i].second, tensors[i].second)) << tensors[i].first;
  }
  EXPECT_EQ(deepspeed::state_dict_file_names(path),
            (std::vector<std::string>{"w", "b", "ids", "mask", "empty"}));

  auto file = ckpt::posix_file_system().open_file(path);
  const auto index = ckpt::read_torch_save_index(*file, path);
  at::Tensor part = torch::empty({3});
  ckpt::read_torch_save_range(*file, path, index, *index.find("w"), 2, part);
  EXPECT_TRUE(torch::equal(part, torch::tensor({2.f, 3.f, 4.f})));
  const std::string msg = dstest::message_of<deepspeed::CheckpointError>(
      [&] { ckpt::read_torch_save_range(*file, path, index, *index.find("w"), 4, part); });
  EXPECT_CONTAINS(msg, "tensor \"w\": elements [4, 7) are outside its 6");
}

// What PyTorch itself writes, checked against the values it printed.
TEST(TorchLoad, ReadsWhatPyTorchWrites) {
  if (!dstest::python_has_torch())
    GTEST_SKIP() << "/usr/bin/python3 with torch (Debian's python3-torch) is not installed";
  dstest::TempDir dir;
  const std::string script = dstest::source_dir() + "/tests/support/torch_save_fixtures.py";
  ASSERT_EQ(std::system(("/usr/bin/python3 " + script + " " + dir.path() + " > " +
                         (dir / "py.log") + " 2>&1")
                            .c_str()),
            0)
      << dstest::read_bytes(dir / "py.log");
  const auto expected = nlohmann::ordered_json::parse(dstest::read_bytes(dir / "expected.json"));
  for (const auto& [file, tensors] : expected.items()) {
    SCOPED_TRACE(file);
    const auto got = deepspeed::load_state_dict_file(dir / file);
    ASSERT_EQ(got.size(), tensors.size());
    size_t i = 0;
    for (const auto& [name, e] : tensors.items()) {
      const at::Tensor& t = got[i++].second;
      EXPECT_EQ(got[i - 1].first, name);
      const std::map<std::string, std::string> dtypes = {
          {"float32", "Float"}, {"bfloat16", "BFloat16"}, {"int64", "Long"}};
      EXPECT_EQ(std::string(c10::toString(t.scalar_type())),
                dtypes.at(e.at("dtype").get<std::string>()))
          << name;
      EXPECT_EQ(t.sizes().vec(), e.at("shape").get<std::vector<int64_t>>()) << name;
      const auto values = e.at("values").get<std::vector<double>>();
      EXPECT_TRUE(torch::equal(t.to(torch::kDouble).reshape({-1}),
                               torch::tensor(values, torch::kDouble)))
          << name;
    }
  }
  // A view with strides reads whole, not by range (its elements are not one run of the record).
  auto file = ckpt::posix_file_system().open_file(dir / "views.bin");
  const auto index = ckpt::read_torch_save_index(*file, dir / "views.bin");
  at::Tensor row = torch::empty({3});
  EXPECT_CONTAINS(dstest::message_of<deepspeed::CheckpointError>([&] {
                    ckpt::read_torch_save_range(*file, dir / "views.bin", index,
                                                *index.find("transposed"), 0, row);
                  }),
                  "tensor \"transposed\": stored with strides [1, 4]");
  ckpt::read_torch_save_range(*file, dir / "views.bin", index, *index.find("narrowed"), 1, row);
  EXPECT_TRUE(torch::equal(row, torch::tensor({5.f, 6.f, 7.f})));  // storage offset 4
  // init_inference's reader takes such a view whole, once, and cuts its slices from that.
  auto source = deepspeed::tp::open_weights(dir / "views.bin", "");
  const auto shape = source->shape("transposed");
  ASSERT_TRUE(shape.has_value());
  const at::Tensor transposed = torch::arange(12, torch::kFloat).view({3, 4}).t();
  EXPECT_TRUE(torch::equal(deepspeed::tp::read_rows(*source, "transposed", *shape, 2, {1, 2}),
                           torch::cat({transposed.narrow(0, 1, 1), transposed.narrow(0, 3, 1)})));
  EXPECT_TRUE(torch::equal(deepspeed::tp::read_columns(*source, "transposed", *shape, {1, 3}),
                           transposed.narrow(1, 1, 2)));
  EXPECT_TRUE(torch::equal(
      deepspeed::tp::read_whole(*source, "transposed", *shape, torch::kDouble),
      transposed.to(torch::kDouble)));
}

// A pickle naming any other global is refused before anything is called, as
// torch.load(weights_only=True) refuses it.
TEST(TorchLoad, AGlobalThatCouldRunCodeIsRefused) {
  dstest::TempDir dir;
  const char kEvil[] = "\x80\x02" "cos\nsystem\n" "X\x04\x00\x00\x00" "true" "\x85R.";
  write_archive(dir / "evil.bin", std::string(kEvil, sizeof kEvil - 1));
  const std::string msg = load_error(dir / "evil.bin");
  EXPECT_CONTAINS(msg, dir / "evil.bin");
  EXPECT_CONTAINS(msg, "global os.system is not allowed");
}

// A whole training checkpoint ({"model": state dict, ...}) is not a state dict: named by key.
TEST(TorchLoad, ANestedDictIsNamedByItsKey) {
  dstest::TempDir dir;
  const char kNested[] = "\x80\x02}(X\x05\x00\x00\x00" "model}u.";
  write_archive(dir / "ckpt.bin", std::string(kNested, sizeof kNested - 1));
  EXPECT_CONTAINS(load_error(dir / "ckpt.bin"), "\"model\" holds a dict, not a tensor");
}

TEST(TorchLoad, NotAZipOrTruncatedIsNamed) {
  dstest::TempDir dir;
  dstest::write_bytes(dir / "legacy.bin", std::string("\x80\x02\x8a\x0a", 4) + "old format");
  EXPECT_CONTAINS(load_error(dir / "legacy.bin"), "not a zip archive");
  EXPECT_CONTAINS(load_error(dir / "legacy.bin"), dir / "legacy.bin");

  const std::string path = dir / "cut.bin";
  ckpt::write_torch_save(ckpt::posix_file_system(), path, {{"w", torch::ones({1000})}});
  const std::string bytes = dstest::read_bytes(path);
  dstest::write_bytes(path, bytes.substr(0, bytes.size() - 300));
  EXPECT_CONTAINS(load_error(path), "torch.save file '" + path + "'");
  EXPECT_CONTAINS(load_error(dir / "missing.bin"), "does not exist");
}

}  // namespace checkpoint_torch_load_test
