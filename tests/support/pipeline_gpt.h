// The example GPT as a pipeline in tests: a tiny configuration, deterministic micro-batches,
// configs and the training loop shared by tests/dist/pipeline_test.cpp,
// pipeline_checkpoint_test.cpp and group_options_checkpoint_test.cpp.
#pragma once
#include <vector>

#include <nlohmann/json.hpp>

#include <string>

#include "deepspeed/pipe.h"
#include "gpt/model.h"

namespace dstest {

constexpr int kPipeWorld = 4;
constexpr int kPipeMicro = 2;        // samples per micro-batch
constexpr int kPipeGlobalMicro = 8;  // micro-batches per step over all data-parallel ranks

// 4 blocks, vocabulary 64, context 8, width 16; `tied`: the head shares the embedding.
gpt::GPTConfig tiny_pipeline_gpt(bool tied);

// Micro-batch g (global index) of step k: random tokens, a fixed function of (k, g), and their
// shift. Data-parallel rank d of D takes g = m * D + d for its m-th micro-batch, so every layout
// trains on the same global batch.
deepspeed::pipe::MicroBatch pipeline_micro_batch(int step, int g);

// AdamW (lr 3e-3, weight decay 0.01), seed 5, the accumulation that keeps kPipeGlobalMicro
// micro-batches per step at `dp_size` data-parallel ranks. With clipping > 0: SGD (lr 1) clipped
// there, as Adam's update hardly depends on the gradient's scale.
nlohmann::json pipeline_config(int dp_size, int zero_stage, double clipping = 0.0);

// `model` as a CPU pipeline of `stages` stages over `comm`, configured by
// pipeline_config(comm's world / stages, zero_stage).
deepspeed::pipe::PipelineInitializeArgs pipeline_args(deepspeed::comm::CommunicatorPtr comm,
                                                      int stages, int zero_stage,
                                                      const gpt::GPTConfig& model);
// The same for any pipeline module.
deepspeed::pipe::PipelineInitializeArgs pipeline_args(deepspeed::comm::CommunicatorPtr comm,
                                                      int stages, int zero_stage,
                                                      deepspeed::pipe::PipelineModule model);

// Steps [from, to) of the global batch sequence on this rank of `comm` (every rank calls it):
// data-parallel rank d = rank % (world / stages) takes micro-batches g = m * (world / stages) + d
// (pipeline_micro_batch), so every layout trains on the same batches. Returns the batch losses.
std::vector<double> train_pipeline_steps(deepspeed::pipe::PipelineEngine& engine,
                                         const deepspeed::comm::CommunicatorPtr& comm, int from,
                                         int to);

// The reference a pipeline's losses are held against: the same layers as one module (seed 5),
// data parallel over `world` ranks as threads on `device`, configured by `config`, trained on
// steps [0, steps) of the same global batches (rank r takes micro-batches g = m * world + r).
// Returns rank 0's batch losses.
std::vector<double> one_module_losses(int world, const gpt::GPTConfig& model,
                                      const nlohmann::json& config, const std::string& device,
                                      int steps);

}  // namespace dstest
