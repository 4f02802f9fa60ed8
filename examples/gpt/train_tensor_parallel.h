// gpt_train's tensor-parallel path (--tensor_parallel N without a pipeline): groups of N
// consecutive ranks split the layers (gpt::TPGPT); world = N x data-parallel ranks, the batch keys
// count the data-parallel ranks. Every rank builds the whole GPT of --seed and keeps its slices.
// No checkpoints or --zero_init yet (both refused by name).
#pragma once
#include <string>

#include "gpt/train_options.h"

namespace gpt_train {

// COLLECTIVE over the world (builds the topology's groups, then trains).
int train_tensor_parallel(const Options& opt, const std::string& config_path,
                          const deepspeed::comm::CommunicatorPtr& comm);

}  // namespace gpt_train
