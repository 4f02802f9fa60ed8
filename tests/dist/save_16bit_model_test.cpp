// Engine::save_16bit_model (DeepSpeed's engine.save_16bit_model): every rank calls it, rank 0
// writes one file of the whole module in its training dtype: a torch.save state dict
// (pytorch_model.bin, DeepSpeed's default, read by Python's torch.load) or safetensors. At stage
// 3 the weights are gathered one unit at a time into the file, and only when
// stage3_gather_16bit_weights_on_model_save is true (else false, nothing written). A pipeline or
// tensor-parallel engine is refused.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "checkpoint/safetensors.h"
#include "deepspeed/errors.h"
#include "deepspeed/pipe.h"
#include "deepspeed/tp.h"
#include "deepspeed/zero_to_fp32.h"
#include "gpt/tp_model.h"
#include "support/expect.h"
#include "support/files.h"
#include "support/pipeline_gpt.h"
#include "support/ranks.h"
#include "support/torch_save_files.h"
#include "support/training_run.h"

namespace save_16bit_model_test {

namespace ckpt = deepspeed::checkpoint;

namespace {

const gpt::GPTConfig kModel{256, 16, 2, 2, 32};

nlohmann::json bf16_config(int stage, bool gather_on_save) {
  auto c = dstest::base_config(2, 1, stage);
  c["bf16"] = {{"enabled", true}};
  c["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = gather_on_save;
  if (stage == 3) c["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
  return c;
}

// Trains `world` ranks 2 steps (the parameters named in `frozen` frozen), then on every rank:
// `body(engine)`.
void after_training(int world, const nlohmann::json& config,
                    const std::function<void(deepspeed::Engine&)>& body,
                    const std::vector<std::string>& frozen = {}) {
  at::set_num_threads(1);
  std::vector<std::shared_ptr<gpt::GPTImpl>> models;
  for (int r = 0; r < world; ++r) {
    torch::manual_seed(7 + r);
    models.push_back(std::make_shared<gpt::GPTImpl>(kModel));
    for (auto& name : frozen) models.back()->named_parameters()[name].set_requires_grad(false);
  }
  auto data = dstest::test_text_dataset(kModel.block_size);
  run_ranks(world, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto r = deepspeed::initialize<gpt::GPTImpl>({.model = models[comm->rank()],
                                                  .config_json = config,
                                                  .training_data = data,
                                                  .comm = comm});
    while (r.engine->global_steps() < 2) {
      auto batch = r.training_dataloader->next();
      r.engine->backward(r.engine->forward(batch.data, batch.target));
      r.engine->step();
    }
    body(*r.engine);
  });
}

}  // namespace

// The file against an independent path: a checkpoint saved by the same engine right after, read
// whole by get_fp32_state_dict_from_zero_checkpoint (each rank's fp32 master partition, merged
// offline; the mask buffer from the module file), cast to bf16: the bf16 weights the engine trains are its masters rounded, so equal
// bit for bit. (consolidated_state_dict() gathers through the same gathered_parameters path as
// save_16bit_model: a stage-3 unit gathered from the wrong partitions or a stale copy would be
// wrong in both alike.)
TEST(Save16bitModel, WritesTheWholeModuleAtStagesTwoAndThree) {
  for (int stage : {2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    dstest::TempDir dir;
    after_training(2, bf16_config(stage, true), [&](deepspeed::Engine& engine) {
      EXPECT_TRUE(engine.save_16bit_model(dir / "out"));
      engine.save_checkpoint(dir / "ck");
    });
    const auto file = dstest::read_torch_save(dir / "out/pytorch_model.bin");
    std::map<std::string, at::Tensor> masters;
    for (auto& [name, t] : deepspeed::get_fp32_state_dict_from_zero_checkpoint(dir / "ck"))
      masters[name] = t;
    ASSERT_FALSE(masters.empty());
    EXPECT_EQ(file.size(), masters.size());
    for (const auto& [name, t] : file) {
      ASSERT_TRUE(masters.count(name)) << name << " is in the file, not in the checkpoint";
      EXPECT_EQ(t.scalar_type(), torch::kBFloat16) << name;
      EXPECT_TRUE(torch::equal(t, masters.at(name).to(torch::kBFloat16))) << name;
    }
  }
}

// The default file as a DeepSpeed user opens it: Python's torch.load (weights_only=True) gives
// the same state dict, key order and bf16 bits, as the safetensors file of the same call.
TEST(Save16bitModel, PythonTorchLoadReadsTheDefaultFile) {
  if (!dstest::python_has_torch())
    GTEST_SKIP() << "/usr/bin/python3 with torch (Debian's python3-torch) is not installed";
  dstest::TempDir dir;
  after_training(2, bf16_config(3, true), [&](deepspeed::Engine& engine) {
    EXPECT_TRUE(engine.save_16bit_model(dir.path()));
    EXPECT_TRUE(engine.save_16bit_model(dir.path(), "model.safetensors"));
  });
  const std::string out =
      dstest::python_compare_torch_save(dir / "pytorch_model.bin", dir / "model.safetensors");
  EXPECT_EQ(out.rfind("ok\n", 0), 0u) << out;
}

TEST(Save16bitModel, StageThreeWithoutGatherOnSaveWritesNothing) {
  dstest::TempDir dir;
  after_training(2, bf16_config(3, false), [&](deepspeed::Engine& engine) {
    EXPECT_FALSE(engine.save_16bit_model(dir / "out"));
  });
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));
}

// exclude_frozen_parameters in either format (the safetensors file with transformers' "format":
// "pt" metadata; *.pt is torch.save as DeepSpeed's); a name that names no file is refused.
TEST(Save16bitModel, ExcludesFrozenParametersInEitherFormat) {
  dstest::TempDir dir;
  after_training(
      1, bf16_config(2, false),
      [&](deepspeed::Engine& engine) {
        EXPECT_TRUE(engine.save_16bit_model(dir.path(), "weights.safetensors",
                                            /*exclude_frozen_parameters=*/true));
        EXPECT_TRUE(engine.save_16bit_model(dir.path(), "weights.pt", true));
        auto msg = dstest::message_of<deepspeed::CheckpointError>(
            [&] { engine.save_16bit_model(dir.path(), ""); });
        EXPECT_CONTAINS(msg, "save_filename \"\" names no file");
      },
      {"wpe.weight"});
  const auto file = ckpt::read_safetensors(dir / "weights.safetensors");
  EXPECT_EQ(file.metadata.at("format"), "pt");
  const auto pickled = dstest::read_torch_save(dir / "weights.pt");
  ASSERT_EQ(pickled.size(), file.tensors.size());
  bool wte = false;
  for (size_t i = 0; i < pickled.size(); ++i) {
    const auto& [name, t] = file.tensors[i];
    EXPECT_NE(name, "wpe.weight");
    EXPECT_EQ(pickled[i].first, name);
    EXPECT_TRUE(torch::equal(pickled[i].second, t)) << name;
    wte = wte || name == "wte.weight";
  }
  EXPECT_TRUE(wte);
}

// Each stage of a pipeline holds its own layers: no rank's file would be the model. Refused on
// every rank before anything is written, naming the way out.
TEST(Save16bitModel, PipelineEngineIsRefused) {
  dstest::TempDir dir;
  std::vector<std::string> messages(2);
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto engine = deepspeed::pipe::initialize_pipeline(dstest::pipeline_args(
        comm, /*stages=*/2, /*zero_stage=*/1, dstest::tiny_pipeline_gpt(/*tied=*/false)));
    messages[comm->rank()] = dstest::message_of<deepspeed::CheckpointError>(
        [&] { engine->save_16bit_model(dir / "out"); });
  });
  for (const std::string& msg : messages) {
    EXPECT_CONTAINS(msg, "save_16bit_model");
    EXPECT_CONTAINS(msg, "pipeline engine");
    EXPECT_CONTAINS(msg, "ds_to_fp32");
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));
}

// With tensor parallelism rank 0 holds its slices only (DeepSpeed writes them as if whole):
// refused on every rank before anything is written.
TEST(Save16bitModel, TensorParallelEngineIsRefused) {
  dstest::TempDir dir;
  std::vector<std::string> messages(2);
  run_ranks(2, [&](deepspeed::comm::CommunicatorPtr comm) {
    auto topology = std::make_shared<deepspeed::comm::Topology>(
        comm, deepspeed::comm::TopologySizes{/*pipe=*/1, /*tensor=*/2});
    auto model = std::make_shared<gpt::TPGPTImpl>(gpt::GPTConfig{256, 16, 2, 4, 32},
                                                  topology->tensor_parallel());
    auto r = deepspeed::initialize<gpt::TPGPTImpl>(
        {.model = model, .config_json = bf16_config(2, false), .topology = topology});
    messages[comm->rank()] = dstest::message_of<deepspeed::CheckpointError>(
        [&] { r.engine->save_16bit_model(dir / "out"); });
  });
  for (const std::string& msg : messages) {
    EXPECT_CONTAINS(msg, "save_16bit_model");
    EXPECT_CONTAINS(msg, "tensor parallelism");
    EXPECT_CONTAINS(msg, "ds_to_fp32");
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));
}

}  // namespace save_16bit_model_test
