// save_16bit_model: the module's weights alone, whole, in one file: a torch.save state dict as
// DeepSpeed's engine.save_16bit_model writes (pytorch_model.bin by default), or safetensors when
// the name says so (model.safetensors, which transformers also reads).
#include <torch/torch.h>

#include <cstdio>

#include "deepspeed/errors.h"
#include "runtime/engine_checkpoint.h"
#include "util/text.h"

namespace deepspeed {

bool Engine::save_16bit_model(const std::string& save_dir, const std::string& save_filename,
                              bool exclude_frozen_parameters) {
  return in_call("save_16bit_model", [&] {
    return checkpoint::save_16bit_model(*state_, checkpoint::posix_file_system(), save_dir,
                                        save_filename, exclude_frozen_parameters);
  });
}

namespace checkpoint {
namespace {

void check_filename(const std::string& name) {
  if (name.empty() || ends_with(name, "/"))
    throw CheckpointError("save_16bit_model: save_filename \"" + name + "\" names no file");
}

}  // namespace

bool save_16bit_model(EngineState& s, FileSystem& fs, const std::string& save_dir,
                      const std::string& save_filename, bool exclude_frozen_parameters) {
  comm::Communicator& job = job_comm(s);
  const std::string path = join_path(save_dir, save_filename);
  // Every rank decides alike from the config, before any collective.
  if (s.config.zero_optimization.stage == 3 &&
      !s.config.zero_optimization.stage3_gather_16bit_weights_on_model_save) {
    // DeepSpeed: "the model will be bogus if not consolidated so don't confuse the user by
    // saving it".
    if (job.rank() == 0)
      std::fprintf(stderr,
                   "[deepspeed] WARNING: save_16bit_model: did not save '%s': ZeRO stage 3 needs "
                   "zero_optimization.stage3_gather_16bit_weights_on_model_save true to gather the "
                   "weights (else save_checkpoint and consolidate with ds_to_fp32)\n",
                   path.c_str());
    return false;
  }
  const bool rank0 = job.rank() == 0;
  const std::string what = "save_16bit_model '" + path + "'";
  // The checks and the folder first, agreed: the write below has every rank walk the
  // parameters (stage 3 gathers), so none may leave before it.
  run_agreed(job, what, [&] {
    check_filename(save_filename);
    // Each rank of these holds part of the model: no one file of one rank is the model.
    if (s.pipeline_files)
      throw CheckpointError("save_16bit_model: not offered for a pipeline engine (each stage holds "
                            "its own layers; DeepSpeed's refuses too): save_checkpoint, then "
                            "consolidate with ds_to_fp32");
    if (tensor_size(s) > 1)
      throw CheckpointError("save_16bit_model: not offered with tensor parallelism (rank 0 holds "
                            "its slices only; DeepSpeed writes them as if whole): save_checkpoint, "
                            "then consolidate with ds_to_fp32");
    require_whole_step(s, "save_16bit_model");
    // As save_checkpoint: inside a modifier scope the file would get edits the scope's end may
    // not keep (only the modifier rank's are). Every rank has the same scopes open.
    refuse_inside_gathered_scope(s, "save_16bit_model");
    if (rank0) fs.make_dirs(parent_dir(path));
  });
  run_agreed(job, what, [&] {
    // transformers reads a safetensors file whose metadata says "format": "pt" (a torch.save
    // file has no metadata).
    write_whole_module(s, fs, path, weights_format_for(save_filename), {{"format", "pt"}}, rank0,
                       !exclude_frozen_parameters);
  });
  return true;
}

}  // namespace checkpoint
}  // namespace deepspeed
