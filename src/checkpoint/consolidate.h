// Checkpoint consolidation (the counterpart of DeepSpeed's zero_to_fp32.py): a checkpoint of any
// world size and ZeRO stage to whole fp32 tensors, reading every rank's fragments. Used by
// build/bin/ds_to_fp32 and by the resharding tests.
#pragma once
#include <string>

#include "checkpoint/file_system.h"
#include "checkpoint/safetensors.h"

namespace deepspeed {
namespace checkpoint {

// The tag folder meant by `path` and `tag`: path itself when it holds a manifest and no tag is
// given, else path/<tag>, with tag defaulting to the content of path/latest. Throws
// CheckpointError naming what is missing.
std::string resolve_tag_dir(FileSystem& fs, const std::string& path, const std::string& tag = "");

// State `kind` ("fp32", "exp_avg", "exp_avg_sq") of every trainable parameter, whole and shaped,
// in registration order. Every file read is verified against the manifest first.
NamedTensors consolidate_trainable(FileSystem& fs, const std::string& tag_dir, const std::string& kind);

// The full module state in fp32: trainable parameters from the fp32 masters (every name of a
// tied one, the model-states file's "shared_params", from its one master), frozen parameters and
// buffers from the model-states file (floating ones converted to fp32, others unchanged), in the
// module's order (parameters, then buffers). `exclude_frozen_parameters` leaves the frozen
// parameters out (zero_to_fp32's option of that name; buffers stay): those neither trained nor
// listed in their module file's "buffer_names". Throws CheckpointError naming a module file
// without "buffer_names" when asked to exclude them.
NamedTensors consolidate_fp32(FileSystem& fs, const std::string& tag_dir,
                              bool exclude_frozen_parameters = false);

}  // namespace checkpoint
}  // namespace deepspeed
