// Checkpoints of a model with a tied parameter (embedding = head, as HF's lm_head.weight =
// wte.weight): libtorch's named_parameters() lists it under both names, the engine trains it once
// under the first. Save, resume and consolidation must go by that name, and the checkpoint records
// the other name (shared_params, as DeepSpeed) so that ds_to_fp32 exports it from the one master.
// One rank, bf16 (the masters are not the module's weights), stages 0 and 2.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <map>

#include "checkpoint/consolidate.h"
#include "checkpoint/layout.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/torch_load.h"
#include "deepspeed/state_dict_file.h"
#include "deepspeed/engine.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/torch_save_files.h"
#include "support/stage3_models.h"

namespace checkpoint_tied_test {

namespace ckpt = deepspeed::checkpoint;
using dstest::bit_identical;

namespace {

// The tie registered before the body: the alias head.weight comes second in named_parameters(),
// so every name after it would shift by one if names were counted per name.
class HeadFirstImpl : public torch::nn::Module {
 public:
  HeadFirstImpl() {
    embed = register_module("embed", torch::nn::Embedding(dstest::kVocab, dstest::kWidth));
    head = register_module("head", dstest::TiedHead(embed->weight));
    body = register_module("body", dstest::Mlp());
  }
  torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets) {
    auto logits = head->forward(body->forward(embed->forward(idx)));
    return torch::nn::functional::cross_entropy(logits.reshape({-1, dstest::kVocab}),
                                                targets.reshape({-1}));
  }
  torch::nn::Embedding embed{nullptr};
  dstest::TiedHead head{nullptr};
  dstest::Mlp body{nullptr};
};

nlohmann::json bf16_config(int stage) {
  auto c = dstest::stage3_test_config(stage);
  c["bf16"] = {{"enabled", true}};
  return c;
}

template <class Model>
struct Tied {
  std::shared_ptr<Model> model;
  std::shared_ptr<deepspeed::ModelEngine<Model>> engine;
  int64_t micro = 0;

  Tied(int stage, uint64_t seed) {
    at::set_num_threads(1);
    torch::manual_seed(seed);
    model = std::make_shared<Model>();
    engine = deepspeed::initialize<Model>(
                 {.model = model,
                  .config_json = bf16_config(stage),
                  .comm = deepspeed::comm::make_single_process_communicator()})
                 .engine;
  }
  void train(int steps) {
    for (int i = 0; i < steps; ++i, ++micro) {
      auto b = dstest::token_batch(0, micro);
      engine->backward(engine->forward(b.idx, b.targets));
      engine->step();
    }
  }
  std::vector<torch::Tensor> weights() const {
    std::vector<torch::Tensor> out;
    for (auto& p : model->parameters()) out.push_back(p.detach().clone());
    return out;
  }
};

std::map<std::string, torch::Tensor> by_name(const ckpt::NamedTensors& tensors) {
  return {tensors.begin(), tensors.end()};
}

// Trains 2 steps, saves, loads into a fresh model: the weights are the saved ones, and a further
// step on each gives the same weights again (the fp32 masters came back too, under their names).
template <class Model>
void resumes_bit_identically(int stage) {
  SCOPED_TRACE("stage " + std::to_string(stage));
  dstest::TempDir dir;
  Tied<Model> saved(stage, 11);
  saved.train(2);
  saved.engine->save_checkpoint(dir.path());
  Tied<Model> loaded(stage, 12);
  ASSERT_NO_THROW(loaded.engine->load_checkpoint(dir.path()));
  EXPECT_TRUE(bit_identical(loaded.weights(), saved.weights()));
  loaded.micro = saved.micro;
  saved.train(1);
  loaded.train(1);
  EXPECT_TRUE(bit_identical(loaded.weights(), saved.weights()));
}

// ds_to_fp32's consolidation: every name of the module with its shape; a trainable one's values
// its fp32 master, the alias's its owner's (not the bf16 copy in the model-states file).
template <class Model>
void consolidates_every_name(int stage) {
  SCOPED_TRACE("stage " + std::to_string(stage));
  dstest::TempDir dir;
  Tied<Model> e(stage, 11);
  e.train(2);
  e.engine->save_checkpoint(dir.path());
  auto& fs = ckpt::posix_file_system();
  const std::string tag = ckpt::resolve_tag_dir(fs, dir.path());
  auto exported = by_name(ckpt::consolidate_fp32(fs, tag));
  auto masters = by_name(ckpt::consolidate_trainable(fs, tag, "fp32"));
  EXPECT_EQ(masters.count("head.weight"), 0u);  // trained once, under its first name
  for (auto& item : e.model->named_parameters()) {
    ASSERT_EQ(exported.count(item.key()), 1u) << item.key();
    EXPECT_EQ(exported[item.key()].sizes(), item.value().sizes()) << item.key();
    const std::string owner = item.key() == "head.weight" ? "embed.weight" : item.key();
    ASSERT_EQ(masters.count(owner), 1u) << owner;
    EXPECT_TRUE(torch::equal(exported[item.key()], masters[owner])) << item.key();
  }
  // The master is not the bf16 weight: the alias taken from the module file would differ.
  EXPECT_FALSE(torch::equal(masters["embed.weight"],
                            e.model->named_parameters()["head.weight"].to(torch::kFloat)));
}

}  // namespace

TEST(CheckpointTied, TieRegisteredLastResumes) {
  for (int stage : {0, 2}) resumes_bit_identically<dstest::TiedModelImpl>(stage);
}

TEST(CheckpointTied, TieRegisteredFirstResumes) {
  for (int stage : {0, 2}) resumes_bit_identically<HeadFirstImpl>(stage);
}

TEST(CheckpointTied, TieRegisteredLastConsolidatesTheAliasFromItsMaster) {
  for (int stage : {0, 2}) consolidates_every_name<dstest::TiedModelImpl>(stage);
}

TEST(CheckpointTied, TieRegisteredFirstConsolidatesEveryNameWithItsShape) {
  for (int stage : {0, 2}) consolidates_every_name<HeadFirstImpl>(stage);
}

// save_16bit_model's torch.save file stores the tied parameter once, for both names (as
// DeepSpeed's: torch.save writes one storage for tensors that share it); Python's torch.load then
// gives both names one memory. The safetensors file, which cannot share, holds a copy per name.
TEST(CheckpointTied, Save16bitModelStoresTheTiedParameterOnce) {
  for (int stage : {0, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    dstest::TempDir dir;
    Tied<HeadFirstImpl> e(stage, 11);
    e.train(1);
    ASSERT_TRUE(e.engine->save_16bit_model(dir.path()));
    ASSERT_TRUE(e.engine->save_16bit_model(dir.path(), "model.safetensors"));
    const std::string bin = dir / "pytorch_model.bin";
    auto file = ckpt::posix_file_system().open_file(bin);
    const auto index = ckpt::read_torch_save_index(*file, bin);
    ASSERT_NE(index.find("head.weight"), nullptr);
    ASSERT_NE(index.find("embed.weight"), nullptr);
    EXPECT_EQ(index.find("head.weight")->storage_key, index.find("embed.weight")->storage_key);
    EXPECT_EQ(index.storage_offsets.size(), index.tensors.size() - 1);
    const auto st = ckpt::read_safetensors(dir / "model.safetensors").tensors;
    const auto read = by_name(deepspeed::load_state_dict_file(bin));
    ASSERT_EQ(read.size(), st.size());
    for (const auto& [name, t] : st) EXPECT_TRUE(torch::equal(read.at(name), t)) << name;
    EXPECT_TRUE(torch::equal(read.at("head.weight"),
                             e.model->named_parameters()["embed.weight"].detach()));
    // The safetensors file is larger by the tied tensor's bytes.
    const int64_t tied_bytes = read.at("head.weight").nbytes();
    EXPECT_GT(static_cast<int64_t>(ckpt::posix_file_system().file_size(dir / "model.safetensors")),
              static_cast<int64_t>(ckpt::posix_file_system().file_size(bin)) + tied_bytes / 2);
    if (!dstest::python_has_torch()) {
      std::printf("[   NOTE   ] torch.load not run: /usr/bin/python3 has no torch\n");
      continue;
    }
    const std::string check =
        "import sys, torch; sd = torch.load(sys.argv[1], weights_only=True); "
        "assert sd['head.weight'].data_ptr() == sd['embed.weight'].data_ptr(), 'two memories'; "
        "assert sd['body.fc.weight'].data_ptr() != sd['embed.weight'].data_ptr()";
    EXPECT_EQ(std::system(("/usr/bin/python3 -c \"" + check + "\" " + bin).c_str()), 0);
  }
}

TEST(CheckpointTied, ModelStatesFileRecordsSharedParams) {
  dstest::TempDir dir;
  Tied<dstest::TiedModelImpl> e(2, 11);
  e.train(1);
  e.engine->save_checkpoint(dir.path(), "t");
  auto meta = ckpt::read_safetensors(dir / ("t/" + ckpt::model_states_file_name())).metadata;
  auto engine_meta = nlohmann::json::parse(meta.at(ckpt::kMetadataKey));
  EXPECT_EQ(engine_meta["shared_params"], (nlohmann::json{{"head.weight", "embed.weight"}}));
}

}  // namespace checkpoint_tied_test
