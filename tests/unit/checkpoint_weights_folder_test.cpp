// Model folders as Hugging Face lays them out and ds_to_fp32 writes them
// (src/checkpoint/weights_folder.h, deepspeed/state_dict_file.h): one file or shards and their
// index, in either format, read whole or by name; the index named itself; transformers' choice
// when a folder holds both formats; and what is refused, named: a folder without weights, a
// missing shard, a shard without a tensor its index puts there, an index pointing elsewhere.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>

#include "checkpoint/shard_plan.h"
#include "checkpoint/weights_folder.h"
#include "deepspeed/errors.h"
#include "deepspeed/state_dict_file.h"
#include "support/expect.h"
#include "support/files.h"

namespace checkpoint_weights_folder_test {

namespace ckpt = deepspeed::checkpoint;

ckpt::NamedTensors model_tensors() {
  return {{"embed.weight", torch::arange(40, torch::kFloat).view({10, 4})},
          {"block0.w", torch::arange(12, torch::kFloat).view({3, 4}) * 0.5},
          {"block0.b", torch::arange(3, torch::kFloat).to(torch::kBFloat16)},
          {"block1.w", torch::arange(12, torch::kFloat).view({4, 3}) - 6},
          {"steps", torch::tensor({int64_t(7)})}};
}

std::string load_error(const std::string& path) {
  return dstest::message_of<deepspeed::CheckpointError>(
      [&] { deepspeed::load_state_dict_file(path); });
}

void expect_tensors(const ckpt::NamedTensors& got, const std::vector<std::string>& names,
                    const ckpt::NamedTensors& from) {
  ASSERT_EQ(got.size(), names.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, names[i]);
    const auto it = std::find_if(from.begin(), from.end(),
                                 [&](const auto& e) { return e.first == got[i].first; });
    ASSERT_NE(it, from.end()) << got[i].first;
    EXPECT_TRUE(torch::equal(got[i].second, it->second)) << got[i].first;
  }
}

// Each export layout (one file, shards) of each format reads back as the tensors written, in
// file order: the shards by name, each in its own order. The index may be named itself.
TEST(WeightsFolder, ReadsEveryExportLayoutOfBothFormats) {
  dstest::TempDir dir;
  const auto tensors = model_tensors();
  for (auto format : {ckpt::WeightsFormat::torch_save, ckpt::WeightsFormat::safetensors}) {
    for (uint64_t max_shard : {uint64_t(1) << 20, uint64_t(64)}) {
      const std::string out = dir / (std::string(ckpt::weights_format_name(format)) + "_" +
                                     std::to_string(max_shard));
      const auto result = ckpt::write_hf_export(ckpt::posix_file_system(), out, format, tensors,
                                                max_shard);
      ASSERT_EQ(result.plan.sharded(), max_shard == 64);
      auto shards = result.plan.shards;
      std::sort(shards.begin(), shards.end(),
                [](const auto& a, const auto& b) { return a.file < b.file; });
      std::vector<std::string> names;
      for (const auto& s : shards) names.insert(names.end(), s.names.begin(), s.names.end());
      SCOPED_TRACE(out);
      EXPECT_EQ(deepspeed::state_dict_file_names(out), names);
      expect_tensors(deepspeed::load_state_dict_file(out), names, tensors);
      if (result.plan.sharded()) {
        const std::string index = out + "/" + ckpt::hf_index_file_name(format);
        EXPECT_EQ(deepspeed::state_dict_file_names(index), names);
        expect_tensors(deepspeed::load_state_dict_file(index), names, tensors);
      }
    }
  }
}

// A Hub folder often holds both formats; transformers reads model.safetensors then.
TEST(WeightsFolder, BothFormatsReadAsSafetensorsAsTransformersDoes) {
  dstest::TempDir dir;
  auto& fs = ckpt::posix_file_system();
  const std::string out = dir / "hub";
  fs.make_dirs(out);
  ckpt::write_weights(fs, out + "/pytorch_model.bin", ckpt::WeightsFormat::torch_save,
                      {{"w", torch::zeros({2})}});
  ckpt::write_weights(fs, out + "/model.safetensors", ckpt::WeightsFormat::safetensors,
                      {{"w", torch::ones({2})}});
  const auto got = deepspeed::load_state_dict_file(out);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(torch::equal(got[0].second, torch::ones({2})));
  const auto folder = ckpt::find_weights_folder(fs, out);
  ASSERT_TRUE(folder.has_value());
  EXPECT_EQ(folder->files, std::vector<std::string>{out + "/model.safetensors"});
  EXPECT_FALSE(ckpt::find_weights_folder(fs, dir / "nothing_here").has_value());
}

// A sharded folder is the tensors its index names: a tensor a shard holds beyond them is not
// read; one the index puts in a shard that lacks it, or in a shard that is missing, is named.
TEST(WeightsFolder, TheIndexDecidesAndItsMistakesAreNamed) {
  dstest::TempDir dir;
  auto& fs = ckpt::posix_file_system();
  const std::string out = dir / "sharded";
  fs.make_dirs(out);
  auto write_index = [&](const std::string& weight_map) {
    fs.write_file_atomic(out + "/pytorch_model.bin.index.json",
                         "{\"metadata\": {}, \"weight_map\": " + weight_map + "}");
  };
  ckpt::write_weights(fs, out + "/a.bin", ckpt::WeightsFormat::torch_save,
                      {{"x", torch::ones({2})}, {"extra", torch::zeros({1})}});
  ckpt::write_weights(fs, out + "/b.bin", ckpt::WeightsFormat::torch_save,
                      {{"y", torch::full({3}, 2.f)}});
  write_index(R"({"x": "a.bin", "y": "b.bin"})");
  EXPECT_EQ(deepspeed::state_dict_file_names(out), (std::vector<std::string>{"x", "y"}));
  const auto got = deepspeed::load_state_dict_file(out);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(torch::equal(got[1].second, torch::full({3}, 2.f)));

  write_index(R"({"x": "a.bin", "y": "a.bin"})");
  for (const auto& msg : {load_error(out), dstest::message_of<deepspeed::CheckpointError>([&] {
                            deepspeed::state_dict_file_names(out);
                          })}) {
    EXPECT_CONTAINS(msg, "pytorch_model.bin.index.json' puts tensor \"y\" in '");
    EXPECT_CONTAINS(msg, "a.bin', which does not hold it");
  }
  write_index(R"({"x": "a.bin", "y": "c.bin"})");
  EXPECT_CONTAINS(load_error(out), "c.bin' named by index '");
  EXPECT_CONTAINS(load_error(out), "' does not exist");
  write_index(R"({"x": "../a.bin"})");
  EXPECT_CONTAINS(load_error(out), "in \"../a.bin\", which is not a file name of its folder");
  write_index(R"({"x": 3})");
  EXPECT_CONTAINS(load_error(out), "is not {\"weight_map\": {name: file}}");
  EXPECT_CONTAINS(load_error(out + "/model.safetensors.index.json"),
                  "model.safetensors.index.json' does not exist");
}

// A folder without weights names the four files looked for; a training checkpoint is named as
// one (ds_to_fp32 exports its weights).
TEST(WeightsFolder, AFolderWithoutWeightsIsNamed) {
  dstest::TempDir dir;
  auto& fs = ckpt::posix_file_system();
  const std::string empty = dir / "empty";
  fs.make_dirs(empty);
  EXPECT_CONTAINS(load_error(empty), "empty' holds neither a model's weights (model.safetensors, "
                                     "model.safetensors.index.json, pytorch_model.bin or "
                                     "pytorch_model.bin.index.json) nor a training checkpoint");
  fs.write_file_atomic(empty + "/latest", "global_step1");
  EXPECT_CONTAINS(load_error(empty), "empty' is a training checkpoint, not a model's weights: "
                                     "ds_to_fp32 exports them");
}

}  // namespace checkpoint_weights_folder_test
