// gpt_train's pipeline path (--pipeline_stages, with --tensor_parallel: pipe x data x tensor).
#pragma once
#include <memory>
#include <string>

#include "gpt/train_options.h"

namespace gpt_train {

// --pipeline_stages: the GPT as a PipelineModule (embedding, blocks, final norm, head; the head
// tied to the embedding with --tie_embeddings), one train_batch() per optimizer step. The
// config's "pipeline" block (stages, partition, activation_checkpoint_interval) applies; the
// batch keys are per data-parallel rank (world / (stages x tensor)), and "auto" keys are filled
// from the flags as without the pipeline. The layers start GPT-2 style from --seed (layer i
// seeded with --seed + i); the data order comes from the config's "seed" and
// dataloader_drop_last, as without the pipeline; --monitor_dir and --wall_clock_breakdown apply.
// The config must have an "optimizer" block (no AdamW from the flags here) and --zero_init is
// refused, both by name. Checkpoints (--save_dir, --load_dir) are the pipeline layout; the data
// position resumes from the step count (global_steps x accumulation micro-batches per
// data-parallel rank). With --tensor_parallel N (> 1) the layers are gpt::gpt_tp_pipeline's,
// split over groups of N consecutive ranks (world = stages x data x N; the batch keys count the
// data ranks). COLLECTIVE over the world.
int train_pipeline(const Options& opt, const std::string& config_path,
                   const deepspeed::comm::CommunicatorPtr& comm,
                   const std::shared_ptr<deepspeed::Dataset>& data);

}  // namespace gpt_train
