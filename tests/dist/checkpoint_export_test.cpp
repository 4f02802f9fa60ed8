// ds_to_fp32: a checkpoint saved by 3 ranks at ZeRO stage 2 (each holding a third of the masters)
// consolidates into one safetensors file of full fp32 weights; Debian's python3-torch reads it
// with its own parser (tests/support/checkpoint_read_safetensors.py) and finds every tensor equal
// to the trained weights, and reads an output folder's pytorch_model.bin (zero_to_fp32's default
// format) with torch.load equal to it.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/tag_reader.h"
#include "checkpoint/weights_file.h"
#include "deepspeed/errors.h"
#include "deepspeed/zero_to_fp32.h"
#include "support/checkpoint_run.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/forked_child.h"
#include "support/stage3_models.h"
#include "support/torch_save_files.h"
#include "support/training_run.h"

namespace checkpoint_export_test {

namespace ckpt = deepspeed::checkpoint;
using nlohmann::json;

namespace {

// Runs ds_to_fp32 with `args`; returns its exit status (-1 when it did not exit) and output.
std::pair<int, std::string> ds_to_fp32(const std::string& args, const std::string& log) {
  const int status =
      std::system((dstest::bin_dir() + "/ds_to_fp32 " + args + " > " + log + " 2>&1").c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, dstest::read_bytes(log)};
}

// A weights file of either format, by name.
std::map<std::string, torch::Tensor> read_by_name(const std::string& path) {
  auto tensors = ckpt::weights_format_for(path) == ckpt::WeightsFormat::safetensors
                     ? ckpt::read_safetensors(path).tensors
                     : dstest::read_torch_save(path);
  return {tensors.begin(), tensors.end()};
}

// A stage-2 checkpoint of `world` ranks holding one trainable parameter "a" = 0, 1, ..., numel-1,
// laid out as a save writes it (manifest, model-states file, one fragment file per rank), written
// directly: training that many ranks would take minutes.
void write_many_rank_checkpoint(const std::string& root, int world, int64_t numel) {
  auto& fs = ckpt::posix_file_system();
  const std::string tag_dir = root + "/global_step1";
  fs.make_dirs(tag_dir);
  const at::Tensor a = torch::arange(numel, torch::kFloat);
  std::vector<std::string> files = {ckpt::model_states_file_name()};
  const json module_meta = {{"shared_params", json::object()}, {"buffer_names", json::array()}};
  ckpt::write_safetensors(fs, tag_dir + "/" + files[0], {{"a", a}},
                          {{ckpt::kMetadataKey, module_meta.dump()}});
  json partitions = json::array();
  for (int r = 0; r < world; ++r) {
    ckpt::NamedTensors tensors;
    json fragments = json::array();
    for (const auto& f : ckpt::partition_fragments({numel}, world, r)) {
      tensors.emplace_back(ckpt::fragment_tensor_name("fp32", "a"),
                           a.narrow(0, f.offset, f.numel).clone());
      fragments.push_back(json::array({"a", f.offset, f.numel}));
    }
    files.push_back(ckpt::optim_states_file_name(r));
    ckpt::write_safetensors(fs, tag_dir + "/" + files.back(), tensors,
                            {{ckpt::kMetadataKey, json{{"rank", r}}.dump()}});
    partitions.push_back({{"rank", r}, {"file", files.back()}, {"fragments", fragments}});
  }
  const json trainable = json::array(
      {json{{"name", "a"}, {"shape", json::array({numel})}, {"numel", numel}}});
  const json meta = {{"format", ckpt::kCheckpointFormat},
                     {"format_version", ckpt::kCheckpointFormatVersion},
                     {"world_size", world},
                     {"zero_stage", 2},
                     {"optimizer", {{"format", ckpt::kAdamFragments}, {"adam_step", 1}}},
                     {"trainable", trainable},
                     {"partitions", partitions}};
  ckpt::write_manifest(fs, tag_dir, ckpt::make_manifest(fs, tag_dir, files, meta));
  fs.write_file_atomic(root + "/latest", "global_step1");
}

// Descriptors this process has open (the listing's own included).
int open_descriptors() {
  const auto it = std::filesystem::directory_iterator("/proc/self/fd");
  return static_cast<int>(std::distance(begin(it), end(it)));
}

}  // namespace

TEST(CheckpointExport, DsToFp32WritesSafetensorsThatPyTorchReads) {
  if (std::system("/usr/bin/python3 -c 'import torch' > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "/usr/bin/python3 with torch (Debian's python3-torch) is not installed";
  dstest::TempDir dir;
  dstest::CheckpointJob job;
  job.world_size = 3;
  job.config = dstest::base_config(2, 1, 2);
  job.steps = 3;
  job.save_dir = dir / "ckpt";
  job.save_at_end = true;
  auto trained = dstest::run_checkpoint_job(job);

  // Expected values as raw float32 files: parameters in registration order, then buffers.
  torch::manual_seed(0);
  gpt::GPTImpl shape_model(job.model);
  nlohmann::json expected = nlohmann::json::array();
  size_t i = 0;
  for (auto& item : shape_model.named_parameters()) {
    const auto& w = trained.weights.at(i);
    const std::string file = "t" + std::to_string(i++) + ".bin";
    dstest::write_bytes(dir / file, std::string(static_cast<const char*>(w.data_ptr()), w.numel() * 4));
    expected.push_back({{"name", item.key()}, {"shape", w.sizes().vec()}, {"file", file}});
  }
  for (auto& item : shape_model.named_buffers()) {  // buffers are not trained: the fresh model's
    auto b = item.value().to(torch::kFloat).contiguous();
    const std::string file = "t" + std::to_string(i++) + ".bin";
    dstest::write_bytes(dir / file, std::string(static_cast<const char*>(b.data_ptr()), b.numel() * 4));
    expected.push_back({{"name", item.key()}, {"shape", b.sizes().vec()}, {"file", file}});
  }
  std::ofstream(dir / "expected.json") << expected.dump();

  const std::string out = dir / "model_fp32.safetensors";
  const std::string tool = dstest::bin_dir() + "/ds_to_fp32 " + (dir / "ckpt") + " " + out;
  int status = std::system((tool + " > " + (dir / "tool.log") + " 2>&1").c_str());
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << dstest::read_bytes(dir / "tool.log");

  const std::string script = dstest::source_dir() + "/tests/support/checkpoint_read_safetensors.py";
  status = std::system(("/usr/bin/python3 " + script + " " + out + " " + dir.path() + " > " +
                        (dir / "py.log") + " 2>&1").c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << dstest::read_bytes(dir / "py.log");

  const auto [code, log] = ds_to_fp32((dir / "ckpt") + " " + (dir / "out"), dir / "tool.log");
  ASSERT_EQ(code, 0) << log;
  EXPECT_CONTAINS(log, dir / "out/pytorch_model.bin");
  const std::string compared =
      dstest::python_compare_torch_save(dir / "out/pytorch_model.bin", out);
  EXPECT_EQ(compared.rfind("ok\n", 0), 0u) << compared;
}

TEST(CheckpointExport, DsToFp32RefusesACorruptedCheckpoint) {
  dstest::TempDir dir;
  dstest::CheckpointJob job;
  job.world_size = 2;
  job.config = dstest::base_config(2, 1, 1);
  job.steps = 1;
  job.save_dir = dir / "ckpt";
  job.save_at_end = true;
  dstest::run_checkpoint_job(job);
  const std::string victim = dir / "ckpt/global_step1/zero_pp_rank_1_mp_rank_00_optim_states.safetensors";
  std::string bytes = dstest::read_bytes(victim);
  bytes[bytes.size() - 5] ^= 1;
  dstest::write_bytes(victim, bytes);
  const std::string log = dir / "tool.log";
  int status = std::system((dstest::bin_dir() + "/ds_to_fp32 " + (dir / "ckpt") + " " +
                            (dir / "out.safetensors") + " > " + log + " 2>&1").c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1);
  const std::string output = dstest::read_bytes(log);
  EXPECT_NE(output.find(victim), std::string::npos) << output;
  EXPECT_NE(output.find("corrupted"), std::string::npos) << output;
}

// A checkpoint of more ranks than a process may hold descriptors for exports: the reader keeps at
// most 64 rank files open (DeepSpeed's zero_to_fp32 loads each and closes it). Consolidated in a
// forked child whose RLIMIT_NOFILE leaves room for 96 more files than it has open, from 200 rank
// files; init_inference and load_checkpoint read through the same reader, which reads a second
// pass over every file (each closed by then, and reopened) the same.
TEST(CheckpointExport, ACheckpointOfMoreRanksThanOpenFilesAllowExports) {
  dstest::TempDir dir;
  constexpr int kWorld = 200;
  constexpr int64_t kNumel = 16 * kWorld * 2;
  write_many_rank_checkpoint(dir / "ckpt", kWorld, kNumel);
  const int status = dstest::run_in_child([&] {
    int code = 0;
    const rlim_t limit = open_descriptors() + 96;
    if (limit >= kWorld) throw std::runtime_error("the limit would not bite");
    struct rlimit rl = {limit, limit};
    if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) throw std::runtime_error("setrlimit failed");
    auto state = deepspeed::get_fp32_state_dict_from_zero_checkpoint(dir / "ckpt");
    if (state.size() != 1 || state[0].first != "a" ||
        !torch::equal(state[0].second, torch::arange(kNumel, torch::kFloat))) {
      std::fprintf(stderr, "child: wrong state (%zu tensors)\n", state.size());
      code = 2;
    }
    ckpt::TagReader reader(ckpt::posix_file_system(), dir / "ckpt/global_step1");
    for (int pass = 0; pass < 2; ++pass) {
      at::Tensor a = torch::empty({kNumel});
      reader.read_range("fp32", "a", 0, a);
      if (!torch::equal(a, torch::arange(kNumel, torch::kFloat))) {
        std::fprintf(stderr, "child: pass %d read other values\n", pass);
        code = 3;
      }
    }
    return code;
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
}

// A file closed by the reader (more rank files than it keeps open) and changed before it is read
// again is named, not read: it was verified when first opened, and its size is checked again.
TEST(CheckpointExport, ARankFileChangedAfterItWasClosedIsNamed) {
  dstest::TempDir dir;
  constexpr int kWorld = 80;
  write_many_rank_checkpoint(dir / "ckpt", kWorld, 16 * kWorld);
  ckpt::TagReader reader(ckpt::posix_file_system(), dir / "ckpt/global_step1");
  at::Tensor a = torch::empty({16 * kWorld});
  reader.read_range("fp32", "a", 0, a);  // rank 0's file closed again by the last ones
  const std::string victim = dir / ("ckpt/global_step1/" + ckpt::optim_states_file_name(0));
  dstest::write_bytes(victim, dstest::read_bytes(victim) + "x");
  const std::string msg = dstest::message_of<deepspeed::CheckpointError>(
      [&] { reader.read_range("fp32", "a", 0, a); });
  EXPECT_CONTAINS(msg, victim);
  EXPECT_CONTAINS(msg, "changed while read");
}

// The output may be an existing folder (zero_to_fp32 takes an output folder): <folder>/
// pytorch_model.bin, zero_to_fp32's default torch.save file. --exclude_frozen_parameters
// (zero_to_fp32's option) leaves the frozen parameter out and keeps the buffers; without it the
// frozen one is there.
TEST(CheckpointExport, DsToFp32WritesIntoAFolderAndExcludesFrozenParameters) {
  dstest::TempDir dir;
  const gpt::GPTConfig model{256, 8, 1, 2, 16};
  auto e = dstest::make_single_engine(dstest::base_config(2, 1, 2), model, 7, {"wpe.weight"});
  e.train(2);
  e.engine->save_checkpoint(dir / "ckpt");
  std::filesystem::create_directories(dir / "out");

  auto [code, log] = ds_to_fp32((dir / "ckpt") + " " + (dir / "out"), dir / "tool.log");
  ASSERT_EQ(code, 0) << log;
  EXPECT_CONTAINS(log, dir / "out/pytorch_model.bin");
  auto whole = read_by_name(dir / "out/pytorch_model.bin");
  EXPECT_EQ(whole.count("wpe.weight"), 1u);

  std::tie(code, log) = ds_to_fp32((dir / "ckpt") + " " + (dir / "trained.safetensors") +
                                       " --exclude_frozen_parameters",
                                   dir / "tool.log");
  ASSERT_EQ(code, 0) << log;
  auto trained = read_by_name(dir / "trained.safetensors");
  EXPECT_EQ(trained.count("wpe.weight"), 0u);
  for (auto& item : e.model->named_parameters()) {
    if (item.key() == "wpe.weight") continue;
    ASSERT_EQ(trained.count(item.key()), 1u) << item.key();
    EXPECT_TRUE(torch::equal(trained[item.key()], item.value())) << item.key();
  }
  for (auto& item : e.model->named_buffers()) {
    ASSERT_EQ(trained.count(item.key()), 1u) << item.key();
    EXPECT_TRUE(torch::equal(trained[item.key()], item.value().to(torch::kFloat))) << item.key();
  }
  EXPECT_EQ(trained.size() + 1, whole.size());
  // The program's form gives the same names.
  const auto in_program = deepspeed::get_fp32_state_dict_from_zero_checkpoint(
      dir / "ckpt", "", /*exclude_frozen_parameters=*/true);
  EXPECT_EQ(in_program.size(), trained.size());
  for (const auto& [name, t] : in_program) EXPECT_EQ(trained.count(name), 1u) << name;
}

// An output folder is split as zero_to_fp32 --max_shard_size splits it (Hugging Face's layout):
// at 4KiB the tied 8 KiB embedding and head (one parameter, two names) get a shard each and the
// rest fill several, every tensor equal to the single-file export and listed, with its file, in
// the index; a default-size export into the same folder then leaves one pytorch_model.bin (the
// default format), the safetensors shards and index removed. A bad size, or a size with a file
// output, is refused naming --max_shard_size; --safe_serialization with a .bin file is refused.
TEST(CheckpointExport, DsToFp32ShardsAnOutputFolderByMaxShardSize) {
  dstest::TempDir dir;
  torch::manual_seed(11);
  auto model = std::make_shared<dstest::TiedModelImpl>();
  auto engine = deepspeed::initialize<dstest::TiedModelImpl>(
                    {.model = model,
                     .config_json = dstest::stage3_test_config(2),
                     .comm = deepspeed::comm::make_single_process_communicator()})
                    .engine;
  const auto batch = dstest::token_batch(0, 0);
  engine->backward(engine->forward(batch.idx, batch.targets));
  engine->step();
  engine->save_checkpoint(dir / "ckpt");
  const auto export_to = [&](const std::string& args) {
    return ds_to_fp32((dir / "ckpt") + " " + args, dir / "tool.log");
  };
  const auto files_in = [](const std::string& folder) {
    std::set<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(folder))
      names.insert(entry.path().filename());
    return names;
  };
  auto [code, log] = export_to(dir / "whole.safetensors");
  ASSERT_EQ(code, 0) << log;
  const auto whole = read_by_name(dir / "whole.safetensors");
  ASSERT_EQ(whole.count("embed.weight"), 1u);
  ASSERT_EQ(whole.count("head.weight"), 1u);

  const std::string out = dir / "out";  // created by the tool, as zero_to_fp32's output_dir
  std::tie(code, log) = export_to(out + " --max_shard_size 4KiB --safe_serialization");
  ASSERT_EQ(code, 0) << log;
  EXPECT_CONTAINS(log, out + "/model.safetensors.index.json");
  const std::set<std::string> files = files_in(out);
  ASSERT_EQ(files.count("model.safetensors.index.json"), 1u);
  EXPECT_EQ(files.count("model.safetensors"), 0u);
  const size_t shards = files.size() - 1;
  ASSERT_GE(shards, 3u);
  char name[64];
  for (size_t i = 1; i <= shards; ++i) {
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i, shards);
    EXPECT_EQ(files.count(name), 1u) << name;
  }

  const json index = json::parse(dstest::read_bytes(out + "/model.safetensors.index.json"));
  uint64_t total = 0;
  for (const auto& [n, t] : whole) total += t.numel() * t.element_size();
  EXPECT_EQ(index.at("metadata").at("total_size").get<uint64_t>(), total);
  ASSERT_EQ(index.at("weight_map").size(), whole.size());
  std::map<std::string, torch::Tensor> read_back;
  for (size_t i = 1; i <= shards; ++i) {
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i, shards);
    const auto shard = ckpt::read_safetensors(out + "/" + name);
    EXPECT_EQ(shard.metadata.at("format"), "pt") << name;
    uint64_t bytes = 0;
    for (const auto& [n, t] : shard.tensors) {
      bytes += t.numel() * t.element_size();
      EXPECT_EQ(index.at("weight_map").value(n, ""), name) << n;
      EXPECT_TRUE(read_back.emplace(n, t).second) << n << " in two shards";
    }
    if (shard.tensors.size() > 1) {
      EXPECT_LE(bytes, 4096u) << name << ": only a lone tensor passes the limit";
    }
  }
  ASSERT_EQ(read_back.size(), whole.size());
  for (const auto& [n, t] : whole) {
    ASSERT_EQ(read_back.count(n), 1u) << n;
    EXPECT_TRUE(torch::equal(read_back[n], t)) << n;
  }
  EXPECT_TRUE(torch::equal(read_back["head.weight"], read_back["embed.weight"]));

  // The default 5GB and format: one torch.save file; the earlier export's shards and index are
  // gone.
  std::tie(code, log) = export_to(out);
  ASSERT_EQ(code, 0) << log;
  EXPECT_CONTAINS(log, "removed " + out + "/model-00001-of-");
  EXPECT_EQ(files_in(out), std::set<std::string>{"pytorch_model.bin"});
  const auto pickled = read_by_name(out + "/pytorch_model.bin");
  ASSERT_EQ(pickled.size(), whole.size());
  for (const auto& [n, t] : whole) EXPECT_TRUE(torch::equal(pickled.at(n), t)) << n;
  // One .bin file of its own, as a named output.
  std::tie(code, log) = export_to(dir / "whole.bin");
  ASSERT_EQ(code, 0) << log;
  EXPECT_CONTAINS(log, "(torch.save)");
  EXPECT_EQ(read_by_name(dir / "whole.bin").size(), whole.size());
  std::tie(code, log) = export_to((dir / "other.bin") + " --safe_serialization");
  EXPECT_EQ(code, 1) << log;
  EXPECT_CONTAINS(log, dir / "other.bin");

  std::tie(code, log) = export_to(out + " --max_shard_size 5XB");
  EXPECT_EQ(code, 1) << log;
  EXPECT_CONTAINS(log, "--max_shard_size '5XB'");
  std::tie(code, log) = export_to((dir / "w.safetensors") + " --max_shard_size 1GB");
  EXPECT_EQ(code, 1) << log;
  EXPECT_CONTAINS(log, "--max_shard_size '1GB'");
  EXPECT_CONTAINS(log, dir / "w.safetensors");
  EXPECT_FALSE(std::filesystem::exists(dir / "w.safetensors"));
}

}  // namespace checkpoint_export_test
