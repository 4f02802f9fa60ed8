// Engine checkpoints: save and load of the whole engine state through a FileSystem (so tests can
// inject faults). Engine::save_checkpoint / load_checkpoint call these on posix_file_system().
// Layout and fragment format: checkpoint/layout.h; guarantees: docs/checkpoints.md.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/file_system.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/weights_file.h"
#include "optim/extra_state.h"
#include "runtime/engine_state.h"

namespace deepspeed {
namespace checkpoint {

class TagReader;

struct SaveOptions {
  std::string tag;  // "" = "global_step<global_steps>"
  nlohmann::json client_state = nlohmann::json::object();
  bool save_latest = true;
};

struct LoadOptions {
  std::string tag;  // "" = the content of <dir>/latest
  bool load_module_strict = true;
  bool load_optimizer_states = true;
  bool load_lr_scheduler_states = true;
  bool load_module_only = false;
};

// Returns the tag folder written. COLLECTIVE.
std::string save_engine_checkpoint(EngineState& state, FileSystem& fs, const std::string& save_dir,
                                   const SaveOptions& options);
// COLLECTIVE.
LoadedCheckpoint load_engine_checkpoint(EngineState& state, FileSystem& fs,
                                        const std::string& load_dir, const LoadOptions& options);

// Visits the module's parameters in named_parameters() order, each whole while it is visited: a
// parameter the stage keeps partitioned is gathered with its group (stage 3: its unit), and the
// group is released after its last parameter (re-partitioned keeping modifier_rank's values when
// one is given). So the module file is written and read with one unit gathered at a time, never
// the whole model (DeepSpeed's stage3_gather_16bit_weights_on_model_save gathers it all).
// visit(name, tensor, grouped): `grouped` says the parameter belongs to a group, so that with a
// modifier rank only that rank's values count. COLLECTIVE (every rank walks the same parameters).
// An exception from `visit` is held until the walk ends, so the ranks' gathers stay matched, and
// then rethrown.
void for_each_whole_parameter(
    EngineState& s, std::optional<int> modifier_rank,
    const std::function<void(const std::string&, const at::Tensor&, bool grouped)>& visit);

// `path` (written atomically by `writer`, in `format`): the module's parameters whole, in
// named_parameters() order (frozen ones only with `frozen_parameters`; a tied one under each of
// its names), then its buffers, each in its own dtype, with `metadata` (safetensors only). Every
// rank walks the parameters (the stage-3 gathers are collective), also when the writer cannot
// create the file. COLLECTIVE.
void write_whole_module(EngineState& s, FileSystem& fs, const std::string& path,
                        WeightsFormat format, const SafetensorsMetadata& metadata, bool writer,
                        bool frozen_parameters);

// DeepSpeed's save_16bit_model (Engine::save_16bit_model). Returns false, writing nothing, at
// stage 3 without stage3_gather_16bit_weights_on_model_save. COLLECTIVE.
bool save_16bit_model(EngineState& s, FileSystem& fs, const std::string& save_dir,
                      const std::string& save_filename, bool exclude_frozen_parameters);

// A trainable parameter's element count when whole (stage 3 keeps released ones empty).
int64_t whole_numel(const EngineState& s, const at::Tensor& param);

// Shared by save and load.
std::string precision_name(const Config& config);
// Trainable parameters go by EngineState::trainable_names (a tied one once, under its first
// name); its other names are EngineState::shared_params, saved as the model-states file's
// "shared_params" ({alias: first name}, as DeepSpeed's) for consolidation to fill them from.
nlohmann::json shared_params_json(const EngineState& s);
// Runs `body` on every rank, then agrees: if any rank threw a deepspeed::Error, c10::Error or JSON
// error, every rank throws CheckpointError (the failing rank its own message) so no rank is left
// waiting in a later collective. `what` names the phase. COLLECTIVE.
void run_agreed(comm::Communicator& comm, const std::string& what, const std::function<void()>& body);

// Tensor-parallel training (InitializeArgs.topology): the tensor size (1 without) and this rank's
// tensor-parallel rank (0 without), which names its mp_rank_TT files.
int tensor_size(const EngineState& s);
int tensor_rank(const EngineState& s);
// The model-parallel rank naming this rank's mp_rank_MM / zero_pp_rank_D_mp_rank_MM files:
// pipeline stage * tensor size + tensor rank (layout.h).
int model_parallel_rank(const EngineState& s);
// {"<parameter>": {"dim", "parts"}} of the module's split parameters (the manifest's
// "tensor_parallel.split").
nlohmann::json tensor_split_json(const EngineState& s);
// The saved rank whose optim file holds what this rank's group replicates (a libtorch optimizer
// archive at stage 0, replicated optimizer extra state): its pipeline stage's / tensor rank's
// data-parallel rank 0. REQUIRES: the checkpoint has this job's pipeline stages and tensor size.
int first_saved_rank_of_group(const TagReader& reader, const EngineState& s);

// save_checkpoint's client_state as stored (checkpoint_client_state.cpp): inf, -inf and NaN, which
// JSON lacks, become {kNonFiniteKey: "inf" | "-inf" | "nan"}. Throws CheckpointError naming the
// JSON pointer of a string or key that is not UTF-8 (the metadata could not be written), of a
// binary value, or of an object using kNonFiniteKey. Local: the save calls it on every rank in
// its first agreed phase, so a client_state that cannot be saved fails every rank together,
// before anything is written.
inline constexpr const char* kNonFiniteKey = "__ds_non_finite__";
nlohmann::json client_state_to_save(const nlohmann::json& client_state);
// The reverse, for load_checkpoint's client_state; `source` (the file) names a malformed one.
nlohmann::json client_state_from_saved(const nlohmann::json& saved, const std::string& source);

// Pieces of a save shared by the plain and the pipeline layout (checkpoint_save.cpp).
// The engine state of a model-states file's metadata: counters, LR schedule, loss scaler, data
// position, client state (as stored: client_state_to_save), config.
nlohmann::json engine_metadata(const EngineState& s, const nlohmann::json& client_state);
std::string optimizer_format(const EngineState& s);  // kAdamFragments, kTorchArchive or kNoOptimizerState
// The step count the optim files and the manifest save (Stage::adam_step: -1 for an optimizer
// without a fragment format), the largest over the job: a rank whose partition keeps no state yet
// (a pipeline stage without trainable parameters, SGD views without momentum) must not save
// another step than the others. COLLECTIVE over the job (after its agreed checks).
int64_t agreed_optimizer_step(EngineState& s);
// [{"name", "shape", "numel"}] of the trainable parameters (whole).
nlohmann::json trainable_list(const EngineState& s, const std::vector<std::string>& names);
// This rank's optimizer-state file dir/file: its fragments (streamed from `state`), RNG state, and
// (non-Adam) optimizer archive; metadata lists the fragments and the trainable parameters.
void write_optim_file(EngineState& s, zero::FragmentState& state, FileSystem& fs,
                      const std::string& dir, const std::string& file,
                      const std::vector<std::string>& names, const std::string& format,
                      int64_t step);
// The manifest metadata every layout has (format, version, tag, world size, stage, precision,
// optimizer format and step (agreed_optimizer_step), global steps).
nlohmann::json manifest_base(const EngineState& s, const std::string& tag, const std::string& format,
                             int64_t step, int world_size);

// The optimizer's extra state (optim/extra_state.h; checkpoint_extra_state.cpp).
struct ExtraStateEntries {
  std::vector<SafetensorsEntry> entries;  // to add to this rank's optimizer-state file
  std::vector<at::Tensor> tensors;        // their data, in order
  nlohmann::json meta;                    // its "optimizer_extra" metadata; null: none
};
ExtraStateEntries extra_state_entries(const EngineState& s);
class TagReader;
// Phase 1 of a load: what this rank's optimizer gets back (nothing when it keeps no extra state,
// or the checkpoint holds another kind's).
optim::ExtraState read_extra_state(TagReader& reader, const EngineState& s);
// After the stage's finish_load. Local.
void apply_extra_state(EngineState& s, const optim::ExtraState& saved);

// The pipeline layout (checkpoint_pipeline.cpp; layout.h describes it).
// Writes the layer files this stage owns (spread over its data-parallel ranks when
// checkpoint.parallel_write.pipeline_stage is on, else all by data-parallel rank 0) and, on
// data-parallel rank 0, the stage's mp_rank_SS_model_states file with the engine state. With
// tensor parallelism each tensor rank TT writes its slices' layer_LL-model_TT files and its
// mp_rank_(SS * T + TT) file.
void write_pipeline_module_files(EngineState& s, FileSystem& fs, const std::string& dir,
                                 const nlohmann::json& client_state);
// On global rank 0 after every rank's files are published: the manifest metadata of the whole
// pipeline, assembled from the optim files' headers (a tied parameter's fragments are listed
// for its lowest stage only; with tensor parallelism every stage's cuts too); `files` receives
// every file of the tag.
nlohmann::json pipeline_manifest_metadata(EngineState& s, FileSystem& fs, const std::string& dir,
                                          const std::string& tag, const std::string& format,
                                          int64_t step, int world_size,
                                          std::vector<std::string>& files);

}  // namespace checkpoint
}  // namespace deepspeed
