// Whole fp32 weights from a checkpoint, in the program: DeepSpeed's
// deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint (build/bin/ds_to_fp32 is
// the command-line form). Any world size, ZeRO stage or pipeline layout; every file is verified
// against the manifest first.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace deepspeed {

// Trainable parameters from the fp32 masters, frozen parameters and buffers from the module
// files (floating ones as fp32), by the module's names. `checkpoint_dir`: a save folder (tag from
// `latest`, or `tag`) or a tag folder. `exclude_frozen_parameters` leaves the frozen parameters
// out (buffers stay), as DeepSpeed's argument of that name. Throws CheckpointError naming what is
// missing or damaged.
std::vector<std::pair<std::string, at::Tensor>> get_fp32_state_dict_from_zero_checkpoint(
    const std::string& checkpoint_dir, const std::string& tag = "",
    bool exclude_frozen_parameters = false);

}  // namespace deepspeed
