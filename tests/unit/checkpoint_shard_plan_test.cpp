// Hugging Face's sharded safetensors export (src/checkpoint/shard_plan.h), as zero_to_fp32.py
// writes it with --max_shard_size: the size strings it takes, huggingface_hub's split (state-dict
// order, an exact fit stays, a tensor over the limit alone and ahead of the shard being filled,
// one shard named model.safetensors), the index, and the folder writer (an earlier export's
// stale files removed, a failed shard write reported and leaving no index).
#include <gtest/gtest.h>

#include <cerrno>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/fault_injecting_file_system.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/shard_plan.h"
#include "deepspeed/errors.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/torch_save_files.h"

namespace checkpoint_shard_plan_test {

namespace ckpt = deepspeed::checkpoint;
using Sizes = std::vector<std::pair<std::string, uint64_t>>;
constexpr auto kSafetensors = ckpt::WeightsFormat::safetensors;
constexpr auto kTorchSave = ckpt::WeightsFormat::torch_save;

std::vector<std::vector<std::string>> names_by_shard(const ckpt::ShardPlan& plan) {
  std::vector<std::vector<std::string>> out;
  for (const auto& shard : plan.shards) out.push_back(shard.names);
  return out;
}

std::vector<std::string> files_of(const ckpt::ShardPlan& plan) {
  std::vector<std::string> out;
  for (const auto& shard : plan.shards) out.push_back(shard.file);
  return out;
}

// Tensors of 1..n floats named t0, t1, ...: distinct values, so a misplaced one shows.
ckpt::NamedTensors numbered_tensors(const std::vector<int64_t>& numels) {
  ckpt::NamedTensors out;
  for (size_t i = 0; i < numels.size(); ++i)
    out.emplace_back("t" + std::to_string(i), torch::arange(numels[i], torch::kFloat) + 100.0 * i);
  return out;
}

TEST(ShardPlan, ParsesSizesAsHuggingFaceDoes) {
  const std::map<std::string, uint64_t> cases = {
      {"5GB", 5000000000ull},   {"5 GB", 5000000000ull},
      {"5gb", 5000000000ull},   {" 5GB ", 5000000000ull},
      {"1000", 1000},           {"1KB", 1000},
      {"3MB", 3000000},         {"2TB", 2000000000000ull},
      {"2KiB", 2048},           {"1MiB", 1 << 20},
      {"3gib", 3ull << 30},     {"1TiB", 1ull << 40},
      {"1.5GB", 1500000000ull}, {"1.5KiB", 1536},
      {"0.0015KB", 1},  // rounded down
      {".5MB", 500000}};
  for (const auto& [text, bytes] : cases)
    EXPECT_EQ(ckpt::parse_byte_size(text, "--max_shard_size"), bytes) << "'" << text << "'";
}

TEST(ShardPlan, RefusesWhatIsNotASizeNamingTheFlagAndTheValue) {
  for (const std::string text : {"5XB", "", "GB", "1.5", "-5GB", "5GB!", "5 G B", "0", "0KB",
                                 "0.0001KB", "99999999999TB", "100000000000000000000", "five"}) {
    const std::string msg = dstest::message_of<deepspeed::ConfigError>(
        [&] { ckpt::parse_byte_size(text, "--max_shard_size"); });
    EXPECT_CONTAINS(msg, "--max_shard_size '" + text + "'");
  }
}

// Tensors join a shard until the next would pass the limit; one that fills it exactly stays.
TEST(ShardPlan, FillsShardsInStateDictOrderAndKeepsAnExactFit) {
  const auto plan = ckpt::plan_shards(Sizes{{"a", 4}, {"b", 6}, {"c", 3}, {"d", 7}, {"e", 1}}, 10);
  EXPECT_EQ(names_by_shard(plan),
            (std::vector<std::vector<std::string>>{{"a", "b"}, {"c", "d"}, {"e"}}));
  EXPECT_EQ(files_of(plan), (std::vector<std::string>{"model-00001-of-00003.safetensors",
                                                      "model-00002-of-00003.safetensors",
                                                      "model-00003-of-00003.safetensors"}));
  EXPECT_TRUE(plan.sharded());
  EXPECT_EQ(plan.total_size, 21u);
  EXPECT_EQ(plan.shards[1].bytes, 10u);
}

// huggingface_hub appends a tensor over the limit as a shard at once, while the shard being
// filled continues after it: "a" and "c" share the second file, after B's.
TEST(ShardPlan, ATensorOverTheLimitGetsAShardOfItsOwnAheadOfTheOneBeingFilled) {
  const auto plan =
      ckpt::plan_shards(Sizes{{"a", 3}, {"B", 25}, {"c", 4}, {"d", 5}, {"e", 10}}, 10);
  EXPECT_EQ(names_by_shard(plan),
            (std::vector<std::vector<std::string>>{{"B"}, {"a", "c"}, {"d"}, {"e"}}));
  EXPECT_EQ(plan.shards[0].file, "model-00001-of-00004.safetensors");
  EXPECT_EQ(plan.shards[0].bytes, 25u);
  EXPECT_EQ(plan.total_size, 47u);
}

// Everything in one shard (or a lone tensor over the limit, or nothing): model.safetensors, no
// index.
TEST(ShardPlan, OneShardIsTheSingleFileModelSafetensors) {
  for (const auto& [sizes, limit] : std::vector<std::pair<Sizes, uint64_t>>{
           {{{"a", 4}, {"b", 6}}, 10}, {{{"big", 11}}, 10}, {{}, 10}}) {
    const auto plan = ckpt::plan_shards(sizes, limit);
    ASSERT_EQ(plan.shards.size(), 1u);
    EXPECT_EQ(plan.shards[0].file, "model.safetensors");
    EXPECT_EQ(plan.shards[0].names.size(), sizes.size());
    EXPECT_FALSE(plan.sharded());
  }
  // Sizes from tensors: numel x element size, whatever the dtype.
  const ckpt::NamedTensors tensors = {{"f", torch::zeros({2, 3})},
                                      {"i", torch::zeros({5}, torch::kLong)},
                                      {"m", torch::zeros({3}, torch::kBool)}};
  EXPECT_EQ(ckpt::plan_shards(tensors, 1000).total_size, 24u + 40u + 3u);
  EXPECT_EQ(names_by_shard(ckpt::plan_shards(tensors, 40)),
            (std::vector<std::vector<std::string>>{{"f"}, {"i"}, {"m"}}));
}

// The index as zero_to_fp32 writes it: json.dumps(index, indent=2, sort_keys=True) + "\n".
TEST(ShardPlan, IndexJsonIsZeroToFp32s) {
  const auto plan = ckpt::plan_shards(Sizes{{"w", 8}, {"b", 4}, {"a", 8}}, 12);
  EXPECT_EQ(plan.index_json(),
            "{\n"
            "  \"metadata\": {\n"
            "    \"total_size\": 20\n"
            "  },\n"
            "  \"weight_map\": {\n"
            "    \"a\": \"model-00002-of-00002.safetensors\",\n"
            "    \"b\": \"model-00001-of-00002.safetensors\",\n"
            "    \"w\": \"model-00001-of-00002.safetensors\"\n"
            "  }\n"
            "}\n");
}

TEST(ShardPlan, TellsExportFileNames) {
  for (const std::string name :
       {"model.safetensors", "model.safetensors.index.json", "model-00001-of-00003.safetensors",
        "model-123456-of-123456.safetensors"})
    EXPECT_TRUE(ckpt::is_hf_export_file_name(name)) << name;
  for (const std::string name :
       {"model-extra.safetensors", "model-00001-of-.safetensors", "model--of-00002.safetensors",
        "model-0000a-of-00002.safetensors", "model-00001-of-00002.safetensors.tmp.12",
        "other.safetensors", "model-00001-of-00002.bin", "pytorch_model-00001-of-00002.pt",
        "pytorch_model-1-of-.bin", "pytorch_model.pt", "config.json"})
    EXPECT_FALSE(ckpt::is_hf_export_file_name(name)) << name;
  for (const std::string name : {"pytorch_model.bin", "pytorch_model.bin.index.json",
                                 "pytorch_model-00001-of-00003.bin"})
    EXPECT_TRUE(ckpt::is_hf_export_file_name(name)) << name;
}

// zero_to_fp32's default format: torch.save files named pytorch_model*.bin and their index. An
// earlier safetensors export in the folder goes (transformers would load its model.safetensors
// first), and a later safetensors export removes this one's files in turn.
TEST(ShardPlan, TorchSaveExportsUsePytorchModelNamesAndReplaceTheOtherFormat) {
  const auto named = ckpt::plan_shards(Sizes{{"w", 8}, {"b", 4}, {"a", 8}}, 12,
                                       kTorchSave);
  EXPECT_EQ(files_of(named), (std::vector<std::string>{"pytorch_model-00001-of-00002.bin",
                                                       "pytorch_model-00002-of-00002.bin"}));
  EXPECT_EQ(files_of(ckpt::plan_shards(Sizes{{"w", 8}}, 12, kTorchSave)),
            std::vector<std::string>{"pytorch_model.bin"});

  dstest::TempDir dir;
  const std::string out = dir / "out";
  const auto tensors = numbered_tensors({4, 6, 3, 7, 1});
  auto& fs = ckpt::posix_file_system();
  ckpt::write_hf_export(fs, out, kSafetensors, tensors, 40);
  const auto result = ckpt::write_hf_export(fs, out, kTorchSave, tensors, 40);
  EXPECT_EQ(result.removed, (std::vector<std::string>{"model.safetensors.index.json",
                                                      "model-00001-of-00003.safetensors",
                                                      "model-00002-of-00003.safetensors",
                                                      "model-00003-of-00003.safetensors"}));
  EXPECT_EQ(fs.list_dir(out), (std::vector<std::string>{"pytorch_model-00001-of-00003.bin",
                                                        "pytorch_model-00002-of-00003.bin",
                                                        "pytorch_model-00003-of-00003.bin",
                                                        "pytorch_model.bin.index.json"}));
  const auto index = nlohmann::json::parse(fs.read_file(out + "/pytorch_model.bin.index.json"));
  EXPECT_EQ(index.at("metadata").at("total_size").get<uint64_t>(), 84u);
  ckpt::NamedTensors read;
  for (int i = 1; i <= 3; ++i) {
    const std::string file = "pytorch_model-0000" + std::to_string(i) + "-of-00003.bin";
    for (auto& item : dstest::read_torch_save(out + "/" + file)) {
      EXPECT_EQ(index.at("weight_map").at(item.first), file);
      read.push_back(item);
    }
  }
  ASSERT_EQ(read.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    bool found = false;
    for (const auto& [n, v] : read) found = found || (n == name && torch::equal(v, t));
    EXPECT_TRUE(found) << name;
  }

  const auto back = ckpt::write_hf_export(fs, out, kSafetensors, tensors, 1000);
  EXPECT_EQ(back.removed.size(), 4u);
  EXPECT_EQ(fs.list_dir(out), std::vector<std::string>{"model.safetensors"});
}

// Shards, then the index; an earlier export's index and the files this one does not write again
// go (a bigger earlier export's shards, a single model.safetensors); other files stay.
TEST(ShardPlan, WritesTheFolderAndRemovesAnEarlierExportsStaleFiles) {
  dstest::TempDir dir;
  const std::string out = dir / "out";
  std::filesystem::create_directories(out);
  for (const std::string stale :
       {"model-00004-of-00009.safetensors", "model.safetensors", "model.safetensors.index.json",
        "model-00001-of-00003.safetensors"})
    dstest::write_bytes(out + "/" + stale, "old");
  for (const std::string keep : {"config.json", "model-extra.safetensors"})
    dstest::write_bytes(out + "/" + keep, "keep");

  const auto tensors = numbered_tensors({4, 6, 3, 7, 1});  // 16, 24, 12, 28, 4 bytes
  auto& fs = ckpt::posix_file_system();
  const auto result = ckpt::write_hf_export(fs, out, kSafetensors, tensors, 40, {{"format", "pt"}});
  ASSERT_EQ(result.plan.shards.size(), 3u);
  EXPECT_EQ(result.removed,
            (std::vector<std::string>{"model.safetensors.index.json",
                                      "model-00004-of-00009.safetensors", "model.safetensors"}));
  EXPECT_EQ(fs.list_dir(out),
            (std::vector<std::string>{"config.json", "model-00001-of-00003.safetensors",
                                      "model-00002-of-00003.safetensors",
                                      "model-00003-of-00003.safetensors", "model-extra.safetensors",
                                      "model.safetensors.index.json"}));
  const auto index = nlohmann::json::parse(fs.read_file(out + "/model.safetensors.index.json"));
  EXPECT_EQ(index.at("metadata").at("total_size").get<uint64_t>(), 84u);
  ASSERT_EQ(index.at("weight_map").size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    const std::string file = index.at("weight_map").at(name).get<std::string>();
    const auto shard = ckpt::read_safetensors(fs, out + "/" + file);
    EXPECT_EQ(shard.metadata.at("format"), "pt");
    bool found = false;
    for (const auto& [n, v] : shard.tensors)
      if (n == name) found = torch::equal(v, t);
    EXPECT_TRUE(found) << name << " in " << file;
  }

  // A smaller export afterwards: one model.safetensors, the shards and index gone.
  const auto single = ckpt::write_hf_export(fs, out, kSafetensors, tensors, 1000);
  EXPECT_FALSE(single.plan.sharded());
  EXPECT_EQ(fs.list_dir(out), (std::vector<std::string>{"config.json", "model-extra.safetensors",
                                                        "model.safetensors"}));
  EXPECT_EQ(ckpt::read_safetensors(fs, out + "/model.safetensors").tensors.size(), tensors.size());
}

// A shard that cannot be written is named, and the folder is left without an index (the earlier
// export's was removed first), so nothing takes the mix for a complete export.
TEST(ShardPlan, AFailedShardWriteIsNamedAndLeavesNoIndex) {
  dstest::TempDir dir;
  const std::string out = dir / "out";
  const auto tensors = numbered_tensors({4, 6, 3, 7, 1});
  ckpt::write_hf_export(ckpt::posix_file_system(), out, kSafetensors,
                        tensors, 40);
  ckpt::FaultInjectingFileSystem fs(ckpt::posix_file_system());
  fs.fail_at(ckpt::FsOp::kCreate, 2, ENOSPC);  // the second shard's (temporary) file
  const std::string msg = dstest::message_of<deepspeed::IOError>(
      [&] { ckpt::write_hf_export(fs, out, kSafetensors, tensors, 40); });
  EXPECT_CONTAINS(msg, out + "/model-00002-of-00003.safetensors");
  EXPECT_FALSE(fs.exists(out + "/model.safetensors.index.json"));
}

}  // namespace checkpoint_shard_plan_test
