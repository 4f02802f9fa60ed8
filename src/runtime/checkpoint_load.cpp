// load_checkpoint in two phases. Phase 1 (local, agreed across ranks): verify every file this
// rank needs against the manifest (checksums), read the headers and the engine state, and check
// they match the engine, changing nothing. Phase 2: read the tensors straight into their places
// (the module's parameters, stage 3 one unit at a time; the optimizer state piece by piece, a
// swapped shard one sub-group at a time), then the stage's finish_load makes every rank's
// parameters equal to the loaded masters. Nothing is held whole in memory, so a checkpoint larger
// than memory loads; the price is that an I/O error in phase 2 (the files were verified in
// phase 1) leaves the engine partly loaded, and the error says so.
// A checkpoint from another world size or stage loads through the fragments (layout.h): each
// rank assembles its own share from the pieces of whichever saved ranks overlap it.
#include <torch/torch.h>

#include <cstdio>
#include <optional>
#include <set>

#include "activation/rng_state.h"
#include "checkpoint/layout.h"
#include "checkpoint/tag_reader.h"
#include "deepspeed/errors.h"
#include "deepspeed/tp.h"
#include "runtime/checkpoint_group_options.h"
#include "runtime/engine_checkpoint.h"
#include "zero/moment_state.h"
#include "zero/stage.h"

namespace deepspeed {
namespace checkpoint {
namespace {

// The engine counters and state objects of the model-states file, parsed (and so validated) in
// phase 1.
struct SavedEngineState {
  int64_t global_steps = 0, global_samples = 0, skipped_steps = 0;
  std::unique_ptr<precision::LossScaler> loss_scaler;  // null: none saved
  nlohmann::json lr_scheduler;                         // null: none saved
  std::optional<LoaderState> loader;
};

// Everything checked in phase 1, applied in phase 2.
struct Plan {
  nlohmann::json model_meta;
  nlohmann::json client_state;  // as given to save_checkpoint (client_state_from_saved)
  SavedEngineState engine;
  // Module parameter or buffer -> (file, tensor name in it), for those the checkpoint holds.
  std::map<std::string, std::pair<ModuleFile, std::string>> module_tensors;
  std::unique_ptr<zero::FragmentState> state;  // fragments to fill: masters (and moments)
  std::vector<std::string> state_kinds;        // "fp32" (, "exp_avg", "exp_avg_sq")
  int64_t adam_step = -1;  // >= 0: set the Adam step
  std::string optimizer_archive;
  // The saved options of every parameter group (lr, betas, ...), laid over the optimizer's before
  // the scheduler's state is loaded; empty: the engine's stay (an old checkpoint, or the
  // optimizer states not loaded).
  GroupOptions group_options;
  at::Tensor rng_state;       // the CPU generator's
  at::Tensor cuda_rng_state;  // the engine's CUDA device's generator's (a CUDA engine only)
  optim::ExtraState extra_state;  // the optimizer's own (extra_state.h); handed back last
  bool load_extra_state = false;
  bool fragments = false;  // masters came from fragments: finish_load must run
  // Trainable parameters the checkpoint holds no optimizer state for (frozen when saved, or new),
  // accepted under load_optimizer_states=false or load_module_strict=false: their fragments are
  // not read; their masters are taken from the module's weights once it is loaded (its saved
  // 16-bit value, or its current one when the checkpoint lacks it), as DeepSpeed rebuilds every
  // master under load_optimizer_states=false.
  std::set<std::string> masters_from_module;
  // zero_optimization.load_from_fp32_weights false: every master is taken from the loaded
  // module's (16-bit) weights and only the moments from the fragments, as DeepSpeed's
  // _restore_from_bit16_weights does (less precise; for a module whose weights were edited).
  bool masters_from_weights = false;
};

// Name -> whole shape of every parameter and buffer of the module.
std::map<std::string, std::vector<int64_t>> module_shapes(const EngineState& s) {
  std::map<std::string, std::vector<int64_t>> out;
  for (auto& item : s.module->named_parameters())
    out[item.key()] = s.stage->whole_shape(item.value());
  for (auto& item : s.module->named_buffers()) out[item.key()] = item.value().sizes().vec();
  return out;
}

// The module file holding `name` (the longest matching prefix), or null.
const ModuleFile* module_file_of(const TagReader& reader, const std::string& name) {
  const ModuleFile* best = nullptr;
  for (const auto& f : reader.module_files())
    if (name.compare(0, f.prefix.size(), f.prefix) == 0 &&
        (!best || f.prefix.size() > best->prefix.size()))
      best = &f;
  return best;
}

// Every module tensor must be in the file its name maps to, with its shape; in strict mode the
// files this module draws from must hold nothing else. (A pipeline stage draws from its own
// layers' files and ignores the other stages'.)
void plan_module(TagReader& reader, const EngineState& s, bool strict, Plan& plan) {
  auto mine = module_shapes(s);
  std::map<std::string, const ModuleFile*> files_used;
  for (const auto& [name, shape] : mine) {
    const ModuleFile* f = module_file_of(reader, name);
    if (f) files_used.emplace(f->file, f);
    const SafetensorsEntry* e = f ? reader.file(f->file).find(name.substr(f->prefix.size())) : nullptr;
    if (!e) {
      if (strict)
        throw CheckpointError("checkpoint '" + reader.dir() + "' lacks module tensor \"" + name +
                              "\"" + (f ? " (in '" + f->file + "')" : std::string()) +
                              " (pass load_module_strict=false to keep its current value)");
      continue;
    }
    const auto saved = reader.module_tensor_shape(*f, *e);  // resharded across tensor sizes
    if (saved != shape)
      throw CheckpointError("checkpoint file '" + join_path(reader.dir(), f->file) +
                            "': tensor \"" + e->name + "\" has shape " +
                            c10::str(c10::IntArrayRef(saved)) + ", the module's is " +
                            c10::str(c10::IntArrayRef(shape)));
    reader.check_module_tensor_sources(*f, e->name);
    plan.module_tensors[name] = {*f, e->name};
  }
  if (!strict) return;
  for (const auto& [file, f] : files_used)
    for (const auto& e : reader.file(file).entries)
      if (!mine.count(f->prefix + e.name))
        throw CheckpointError("checkpoint file '" + join_path(reader.dir(), file) + "' has tensor \"" +
                              e.name + "\" that the module lacks (pass load_module_strict=false to "
                              "ignore)");
}

// Every trainable parameter the checkpoint holds state for must have its element count. One it
// holds none for is refused, unless `allow_missing`: then it is returned, for its master to be
// taken from the module (Plan::masters_from_module).
std::set<std::string> check_trainable(const TagReader& reader, const EngineState& s,
                                      const std::vector<std::string>& names, bool allow_missing) {
  std::map<std::string, const TrainableInfo*> saved;
  for (const auto& t : reader.trainable()) saved[t.name] = &t;
  std::set<std::string> missing;
  for (size_t k = 0; k < names.size(); ++k) {
    auto it = saved.find(names[k]);
    if (it == saved.end() && allow_missing) {
      missing.insert(names[k]);
      continue;
    }
    if (it == saved.end())
      throw CheckpointError("checkpoint '" + reader.dir() + "' has no optimizer state for trainable "
                            "parameter \"" + names[k] + "\" (was it frozen when saved, or is it "
                            "new?); pass load_optimizer_states=false to take its fp32 master from "
                            "the loaded weights (load_module_strict=false too if the checkpoint "
                            "lacks its weights)");
    if (it->second->numel != whole_numel(s, s.trainable[k]))
      throw CheckpointError("checkpoint '" + reader.dir() + "': parameter \"" + names[k] +
                            "\" has " + std::to_string(it->second->numel) +
                            " elements, the module's has " +
                            std::to_string(whole_numel(s, s.trainable[k])));
  }
  return missing;
}

// libtorch's optimizer archive must match the optimizer's parameter groups, group by group
// (`saved`: read_archive_groups' sizes); checked before anything is loaded, so a changed grouping
// (a client optimizer now with a no-decay group, say) is named here instead of by libtorch's check
// halfway through the load. An archive read otherwise (another optimizer's own serialize(): no
// sizes) is left to the optimizer's load.
void check_archive_groups(const TagReader& reader, torch::optim::Optimizer& optimizer,
                          const std::vector<int64_t>& saved) {
  if (saved.empty()) return;
  std::vector<int64_t> now;
  for (const auto& group : optimizer.param_groups())
    now.push_back(static_cast<int64_t>(group.params().size()));
  if (saved == now) return;
  auto list = [](const std::vector<int64_t>& sizes) {
    std::string text;
    for (int64_t n : sizes) text += (text.empty() ? "" : ", ") + std::to_string(n);
    return std::to_string(sizes.size()) + " parameter group(s) of " + text + " tensors";
  };
  throw CheckpointError("checkpoint '" + reader.dir() + "': the optimizer's state was saved with " +
                        list(saved) + "; the optimizer now has " + list(now) +
                        " (a client optimizer grouped differently?). Build it with the saved "
                        "grouping, or pass load_optimizer_states=false to load the weights alone");
}

// A libtorch optimizer's own archive holds whole per-rank state: usable where the saved and the
// current rank hold the same parameters (stage 0 anywhere, or the same stage and world size).
void plan_torch_archive(TagReader& reader, const EngineState& s, Plan& plan) {
  const int stage = s.config.zero_optimization.stage, world = s.comm->world_size();
  const int stages = s.pipeline_files ? s.pipeline_files->stages : 1;
  const int saved_dp =
      reader.world_size() / reader.pipeline_stages() / reader.tensor_parallel_size();
  const bool replicated = reader.zero_stage() == 0 && s.stage->replicated_state();
  const bool same_stages =
      reader.pipeline_stages() == stages && reader.tensor_parallel_size() == tensor_size(s);
  if (!same_stages || (!replicated && (reader.zero_stage() != stage || saved_dp != world)))
    throw CheckpointError("checkpoint '" + reader.dir() +
                          "' holds a libtorch optimizer archive (a client optimizer's own "
                          "state) saved at world size " +
                          std::to_string(reader.world_size()) + " (pipeline stages " +
                          std::to_string(reader.pipeline_stages()) + ", tensor-parallel size " +
                          std::to_string(reader.tensor_parallel_size()) + "), ZeRO stage " +
                          std::to_string(reader.zero_stage()) +
                          "; it reloads only at the same world size, pipeline and stage (or stage "
                          "0 to stage 0), not at world size " +
                          std::to_string(job_comm(s).world_size()) + " (pipeline stages " +
                          std::to_string(stages) + ", tensor-parallel size " +
                          std::to_string(tensor_size(s)) + "), stage " + std::to_string(stage) +
                          ". Pass load_optimizer_states=false to load the "
                          "weights alone");
  // Stage 0 replicates the state: the file of the group's first data-parallel rank serves every
  // rank of it.
  const int job_rank = job_comm(s).rank();
  const int file_rank = replicated ? first_saved_rank_of_group(reader, s) : job_rank;
  at::Tensor bytes = reader.tensor(reader.partition_file(file_rank), "optimizer_archive");
  plan.optimizer_archive.assign(static_cast<const char*>(bytes.data_ptr()), bytes.numel());
  auto groups = read_archive_groups(plan.optimizer_archive, *s.optimizer);
  check_archive_groups(reader, *s.optimizer, groups.sizes);
  // libtorch's load restores the state only; its groups' options are in the archive too.
  plan.group_options = std::move(groups.options);
}

// Checks that the checkpoint covers every fragment this rank loads (headers only).
// `format`: the optimizer format whose kinds this load reads (kNoOptimizerState: masters only).
void plan_fragments(TagReader& reader, EngineState& s, const std::vector<std::string>& names,
                    const std::string& format, Plan& plan) {
  plan.fragments = true;
  plan.state = s.stage->state_to_load(/*create_moments=*/is_fragment_format(format));
  plan.state_kinds = state_kinds(format);
  for (const auto& f : plan.state->fragments())
    if (!plan.masters_from_module.count(names.at(f.param)))
      for (const auto& kind : plan.state_kinds)
        reader.check_range(kind, names.at(f.param), f.offset, f.numel);
}

// The saved optim file whose parameter-group options this rank takes. Every data-parallel and
// tensor rank of a pipeline stage saved the same ones, so: the file holding the first element
// this rank loads (one the load reads anyway), else its stage's first file (a rank loading no
// fragment), else saved rank 0's (another pipeline or tensor layout).
std::string group_options_file(const TagReader& reader, const EngineState& s,
                               const std::vector<std::string>& names, const Plan& plan) {
  for (const auto& f : plan.state->fragments()) {
    const std::string& name = names.at(f.param);
    if (f.numel == 0 || plan.masters_from_module.count(name)) continue;
    const auto ranks = reader.ranks_holding(name, f.offset, 1);
    if (!ranks.empty()) return reader.partition_file(ranks.front());
  }
  const int stages = s.pipeline_files ? s.pipeline_files->stages : 1;
  if (reader.pipeline_stages() == stages && reader.tensor_parallel_size() == tensor_size(s))
    return reader.partition_file(first_saved_rank_of_group(reader, s));
  return reader.partition_file(0);
}

// An Adam-format checkpoint's "param_groups" (checkpoint_group_options.h): one per group of the
// optimizer, or refused, as DeepSpeed's optimizer load refuses another number of groups. None
// saved (a checkpoint from before they were): the engine's options stay.
void plan_fragment_group_options(TagReader& reader, EngineState& s,
                             const std::vector<std::string>& names, Plan& plan) {
  const std::string file = group_options_file(reader, s, names, plan);
  const nlohmann::json meta = reader.file_metadata(file);
  auto it = meta.find(kParamGroupsKey);
  if (it == meta.end()) return;
  const std::string source = "checkpoint file '" + join_path(reader.dir(), file) + "'";
  if (!it->is_array())
    throw CheckpointError(source + ": \"" + std::string(kParamGroupsKey) + "\" is not a list");
  const size_t now = s.optimizer->param_groups().size();
  if (it->size() != now)
    throw CheckpointError("checkpoint '" + reader.dir() +
                          "': the optimizer's state was saved with " + std::to_string(it->size()) +
                          " parameter group(s); the optimizer now has " + std::to_string(now) +
                          " (a client optimizer or model_parameters grouped differently?). Build "
                          "it with the saved groups, or pass load_optimizer_states=false to load "
                          "the weights alone");
  plan.group_options = group_options_from_json(*it, *s.optimizer, source);
}

// What a checkpoint's optimizer format holds, in an error message.
std::string format_holds(const std::string& format) {
  if (format == kAdamFragments) return "Adam moments";
  if (format == kLionFragments) return "Lion's momentum";
  if (format == kAdagradFragments) return "Adagrad's sums";
  if (format == kSgdFragments) return "SGD's momentum buffers";
  return "a libtorch optimizer archive (an optimizer other than Adam's family, Lion, Adagrad or "
         "SGD)";
}

void plan_optimizer(TagReader& reader, EngineState& s, const std::vector<std::string>& names,
                    bool load_states, Plan& plan) {
  const std::string& format = reader.optimizer_format();
  if (!load_states || !s.optimizer || format == kNoOptimizerState) {
    plan_fragments(reader, s, names, kNoOptimizerState, plan);
    return;
  }
  if (format != kTorchArchive && !is_fragment_format(format))
    throw CheckpointError("checkpoint manifest '" + reader.dir() + "': unknown optimizer format \"" +
                          format + "\"");
  // Each format loads into the optimizer that saves it: converting state between optimizers
  // (Adam's two moments into Lion's one, or either into SGD's buffer) is not a resume.
  const std::string ours = s.stage->adam_step() >= 0
                               ? zero::moment_format(zero::moment_family(s.optimizer.get()))
                               : kTorchArchive;
  if (format == kTorchArchive &&
      zero::keeps_one_moment(zero::moment_family(s.optimizer.get())))
    throw CheckpointError("checkpoint '" + reader.dir() + "' holds a libtorch optimizer archive, "
                          "but this engine's optimizer keeps " + format_holds(ours) +
                          ", which it loads only from \"" + ours + "\" fragments (earlier "
                          "builds saved Lion's, Adagrad's and SGD's state as an archive too): pass "
                          "load_optimizer_states=false to load the weights alone");
  if (format != ours)
    throw CheckpointError("checkpoint '" + reader.dir() + "' holds " + format_holds(format) +
                          " but this engine's optimizer keeps " + format_holds(ours) +
                          ": converting optimizer state is not supported; pass "
                          "load_optimizer_states=false to load the weights alone");
  if (is_fragment_format(format)) {
    plan_fragments(reader, s, names, format, plan);
    plan.adam_step = reader.meta().at("optimizer").at("adam_step").get<int64_t>();
    plan_fragment_group_options(reader, s, names, plan);
    return;
  }
  if (!plan.masters_from_module.empty())
    throw CheckpointError("checkpoint '" + reader.dir() + "' holds a libtorch optimizer archive, "
                          "which does not cover trainable parameter \"" +
                          *plan.masters_from_module.begin() +
                          "\"; pass load_optimizer_states=false to load the weights alone");
  plan_fragments(reader, s, names, kNoOptimizerState, plan);
  plan_torch_archive(reader, s, plan);
}

// An epoch the saved job had finished (it took its last micro-batch: partial or padded, or with
// dataloader_drop_last the last whole one, the tail dropped) resumes at the next epoch's start,
// also at the same samples per step: with drop_last the number of micro-batches an epoch can
// differ (11 samples: 1 of 6 at world 1, 2 steps of 3 at world 2). Otherwise, at the same world
// size and micro batch, the exact position; at another, the same number of samples consumed in
// the epoch, rounded down to whole micro-batches of the new job.
LoaderState resumed_loader_state(const nlohmann::json& saved, const EngineState& s) {
  LoaderState ls{saved.at("epoch").get<int64_t>(), saved.at("batch_in_epoch").get<int64_t>()};
  const int64_t old_micro = saved.at("micro_batch_size").get<int64_t>();
  const int64_t old_world = saved.at("world_size").get<int64_t>();
  // The saved job's batches per epoch, as its sampler and loader cut them (sampler.cpp,
  // data_loader.cpp): the sampler always pads a rank's shard to ceil(N / world) (drop_last goes
  // to the loader alone, as DeepSpeed's), and drop_last drops the shard's last partial
  // micro-batch. Checkpoints before "drop_last" and "dataset_size" were saved: this job's.
  const int64_t n = saved.contains("dataset_size") ? saved.at("dataset_size").get<int64_t>()
                                                   : s.training_data->size();
  const bool drop_last = saved.contains("drop_last") ? saved.at("drop_last").get<bool>()
                                                     : s.config.dataloader_drop_last;
  const int64_t shard = (n + old_world - 1) / old_world;
  const int64_t old_batches = drop_last ? shard / old_micro : (shard + old_micro - 1) / old_micro;
  if (ls.batch_in_epoch >= old_batches) return {ls.epoch + 1, 0};
  const int64_t new_step = s.config.train_micro_batch_size_per_gpu * s.comm->world_size();
  if (old_micro * old_world == new_step) return ls;
  ls.batch_in_epoch = ls.batch_in_epoch * old_micro * old_world / new_step;
  return ls;
}

SavedEngineState parse_engine_state(const TagReader& reader, const nlohmann::json& m, const EngineState& s) {
  SavedEngineState e;
  try {
    e.global_steps = m.at("global_steps").get<int64_t>();
    e.global_samples = m.at("global_samples").get<int64_t>();
    e.skipped_steps = m.at("skipped_steps").get<int64_t>();
    // The saved scaler is fp16's state; every other precision saves a static 1. Taken across
    // precisions it would replace an fp16 engine's dynamic scaler by a static 1 (its gradients
    // underflow) or give a bf16/fp32 engine a growing scale nothing checks for overflow. So it is
    // taken only from an fp16 checkpoint into an fp16 engine; otherwise the engine keeps its own.
    const auto saved_precision = reader.manifest().metadata.value("precision", std::string());
    if (!m.at("loss_scaler").is_null() && saved_precision == "fp16" && s.config.fp16.enabled)
      e.loss_scaler = precision::loss_scaler_from_state_dict(m.at("loss_scaler"));
    e.lr_scheduler = m.at("lr_scheduler");
    if (s.loader && !m.at("data_sampler").is_null()) e.loader = resumed_loader_state(m.at("data_sampler"), s);
  } catch (const nlohmann::json::exception& err) {
    throw CheckpointError("checkpoint file '" + join_path(reader.dir(), reader.engine_file()) +
                          "': engine state is malformed: " + err.what());
  }
  return e;
}

// The saved scheduler state must load into this engine's scheduler (another schedule's or a client
// scheduler's state may not): asked here, as its load comes late in phase 2, after the module and
// the optimizer state were written.
void check_scheduler_state(const TagReader& reader, const EngineState& s, const nlohmann::json& saved) {
  if (!s.scheduler || saved.is_null()) return;
  try {
    s.scheduler->check_state_dict(saved);
  } catch (const Error& e) {
    throw CheckpointError("checkpoint file '" + join_path(reader.dir(), reader.engine_file()) +
                          "': its \"lr_scheduler\" state does not load into this engine's " +
                          s.scheduler->name() + " (" + e.what() +
                          "); pass load_lr_scheduler_states=false to keep the engine's schedule");
  }
}

// Each rank reads the checkpoint as its tensor rank's: at the saved tensor size its own slices'
// files (resharding across data-parallel sizes and stages as usual); at another size (a
// checkpoint without tensor parallelism is size 1) the slices this model's layers cut, assembled
// from the saved ones (TagReader::view_as_tensor_rank).
// A pipeline stage's module holds its own layers only: the cuts of the others' are not compared.
void select_tensor_rank(TagReader& reader, const EngineState& s) {
  std::map<std::string, TensorSplit> splits;
  for (const auto& [name, dim] : tp::split_parameter_dims(*s.module))
    splits[name] = {dim.dim, dim.parts};
  std::set<std::string> params;
  for (auto& item : s.module->named_parameters()) params.insert(item.key());
  reader.view_as_tensor_rank(tensor_size(s), tensor_rank(s), splits,
                             s.pipeline_files ? &params : nullptr);
}

// A pipeline's checkpoint (its module in layer files, tensors named after the pipeline's layers)
// loaded by an engine without a pipeline, or the reverse: no tensor name can match, so say why
// instead of naming the first tensor not found.
void check_same_module_layout(const TagReader& reader, const EngineState& s) {
  bool saved_layers = false;
  for (const auto& f : reader.module_files()) saved_layers = saved_layers || f.layer >= 0;
  const bool loading_pipeline = s.pipeline_files != nullptr;
  if (saved_layers == loading_pipeline) return;
  if (saved_layers)
    throw CheckpointError(
        "checkpoint '" + reader.dir() + "' was saved by a pipeline engine (" +
        std::to_string(reader.pipeline_stages()) +
        " stages; its module is in layer_LL files, named after the PipelineModule's layers), but "
        "this engine's model is not a PipelineModule: load it into a PipelineModule of the same "
        "layers (any number of stages), or consolidate it with ds_to_fp32");
  throw CheckpointError("checkpoint '" + reader.dir() +
                        "' was saved without a pipeline (its module is in " +
                        model_states_file_name() +
                        ", named after the plain model), but this engine runs a PipelineModule: "
                        "load it into the plain model, or consolidate it with ds_to_fp32");
}

Plan make_plan(TagReader& reader, EngineState& s, const LoadOptions& o) {
  check_same_module_layout(reader, s);
  select_tensor_rank(reader, s);
  Plan plan;
  plan.model_meta = reader.file_metadata(reader.engine_file());
  plan.client_state = client_state_from_saved(
      plan.model_meta.value("client_state", nlohmann::json::object()),
      "checkpoint file '" + join_path(reader.dir(), reader.engine_file()) + "'");
  plan_module(reader, s, o.load_module_strict, plan);
  if (o.load_module_only) return plan;
  plan.engine = parse_engine_state(reader, plan.model_meta, s);
  if (o.load_lr_scheduler_states) check_scheduler_state(reader, s, plan.engine.lr_scheduler);
  const auto& names = s.trainable_names;
  plan.masters_from_module =
      check_trainable(reader, s, names, !o.load_optimizer_states || !o.load_module_strict);
  plan_optimizer(reader, s, names, o.load_optimizer_states, plan);
  plan.masters_from_weights = plan.state && !s.config.zero_optimization.load_from_fp32_weights;
  // An optimizer's extra state (optim/extra_state.h) is per rank's parameters: not carried
  // across tensor sizes, nor to a model that trains parameters the checkpoint did not.
  if (o.load_optimizer_states && s.optimizer && reader.tensor_parallel_size() == tensor_size(s) &&
      plan.masters_from_module.empty()) {
    plan.load_extra_state = true;
    plan.extra_state = read_extra_state(reader, s);
  }
  // RNG states only where every rank has its saved counterpart: the same world and pipeline.
  comm::Communicator& job = job_comm(s);
  const int stages = s.pipeline_files ? s.pipeline_files->stages : 1;
  // The CUDA generator's state only into a CUDA engine, and only when the checkpoint has it (saved
  // on a CUDA engine by a version that saves it); otherwise the engine's stays as it is.
  if (reader.world_size() == job.world_size() && reader.pipeline_stages() == stages &&
      reader.tensor_parallel_size() == tensor_size(s)) {
    const std::string& file = reader.partition_file(job.rank());
    plan.rng_state = reader.tensor(file, "rng_state");
    if (s.device.is_cuda() && reader.file(file).find("cuda_rng_state"))
      plan.cuda_rng_state = reader.tensor(file, "cuda_rng_state");
  }
  return plan;
}

void apply_engine_state(EngineState& s, Plan& plan, const LoadOptions& o) {
  auto& e = plan.engine;
  s.global_steps = e.global_steps;
  s.global_samples = e.global_samples;
  // At this job's first boundary, not the saved count: another accumulation (the same batch at
  // another world size) would put the first boundary elsewhere, and the gradients of a step
  // saved halfway are not in the checkpoint anyway. DeepSpeed restarts the count at 0.
  s.micro_steps = e.global_steps * s.config.gradient_accumulation_steps;
  s.skipped_steps = e.skipped_steps;
  s.loss_since_boundary = at::Tensor();
  // DeepSpeed keeps the scaler in the optimizer's state: without it the engine keeps its own.
  if (e.loss_scaler && o.load_optimizer_states) s.loss_scaler = std::move(e.loss_scaler);
  if (o.load_lr_scheduler_states && s.scheduler && !e.lr_scheduler.is_null())
    s.scheduler->load_state_dict(e.lr_scheduler);
  if (e.loader) {
    s.loader->load_state(*e.loader);
    s.loader_at_boundary = s.loader->state();
  }
  if (plan.rng_state.defined()) checkpointing::set_generator_state(c10::kCPU, plan.rng_state);
  if (plan.cuda_rng_state.defined())
    checkpointing::set_generator_state(s.device, plan.cuda_rng_state);
  // The engine is at a boundary now: a save before the next step() saves these states.
  capture_rng_at_boundary(s);
}

// load_module_only keeps the engine's counters, but not a partial accumulation: the load drops
// its gradients (discard_gradients), so its micro-steps and their loss go too, and the next
// step() comes after a whole gradient_accumulation_steps again (not after the rest of them, still
// divided by all). The engine is at a boundary, where the loader and the generators now are.
void restart_accumulation(EngineState& s) {
  s.micro_steps -= s.micro_steps % s.config.gradient_accumulation_steps;
  s.loss_since_boundary = at::Tensor();
  if (s.loader) s.loader_at_boundary = s.loader->state();
  capture_rng_at_boundary(s);
}

// The module's tensors from the file, straight into place. Stage 3: unit by unit, rank 0's values
// re-partitioned (so only rank 0 reads the partitioned parameters). COLLECTIVE.
void apply_module(EngineState& s, TagReader& reader, const Plan& plan) {
  torch::NoGradGuard no_grad;
  const bool rank0 = s.comm->rank() == 0;
  auto read = [&](const std::string& name, const at::Tensor& dst) {
    auto it = plan.module_tensors.find(name);
    if (it != plan.module_tensors.end())
      reader.read_module_tensor(it->second.first, it->second.second, dst);
  };
  for_each_whole_parameter(s, /*modifier_rank=*/0,
                           [&](const std::string& name, const at::Tensor& p, bool grouped) {
                             if (rank0 || !grouped) read(name, p);
                           });
  for (auto& item : s.module->named_buffers()) read(item.key(), item.value().detach());
}

// The fragments, piece by piece, each read from the rank files straight into the optimizer's
// state (a swapped shard: one sub-group in memory at a time).
void apply_fragments(TagReader& reader, const std::vector<std::string>& names, Plan& plan) {
  torch::NoGradGuard no_grad;
  auto& state = *plan.state;
  for (size_t i = 0; i < state.fragments().size(); ++i) {
    const auto& f = state.fragments()[i];
    const std::string& name = names.at(f.param);
    if (plan.masters_from_module.count(name)) continue;  // refreshed from the module (apply_rest)
    for (auto [offset, numel] : state.pieces(i)) {
      const auto views = state.piece(i, offset, numel);
      // Kind 0 is the master: under masters_from_weights it keeps the module's value, which
      // refresh_masters_from_model put there (a swapped window is read whole, so it stays).
      for (size_t k = plan.masters_from_weights ? 1 : 0; k < plan.state_kinds.size(); ++k) {
        // A moment the optimizer keeps none of for this parameter (a stage-0 client optimizer
        // holding only some of the trainable parameters) is not read; a master always is.
        if (k > 0 && !views[k].defined()) continue;
        TORCH_CHECK(views[k].defined(), "load_checkpoint: no ", plan.state_kinds[k],
                    " state to load \"", name, "\" into (internal error)");
        reader.read_range(plan.state_kinds[k], name, f.offset + offset, views[k]);
      }
    }
  }
  state.finish();
  plan.state.reset();
}

// After apply_module (and, under stage 3, the re-partitioning of the module's weights), so the
// fp32 masters come from the optimizer files, not from the rounded 16-bit module copy.
void apply_rest(EngineState& s, TagReader& reader, Plan& plan, const LoadOptions& o) {
  torch::NoGradGuard no_grad;
  // Every master from the module first, then the saved ones over it: what stays is the module's
  // for the parameters the checkpoint holds no state for. (A window the fragments touch is read
  // whole before it is written: zero/shard_optimizer.h.)
  if (plan.state && (!plan.masters_from_module.empty() || plan.masters_from_weights))
    s.stage->refresh_masters_from_model();
  if (plan.state) apply_fragments(reader, s.trainable_names, plan);
  if (!plan.optimizer_archive.empty()) {
    torch::serialize::InputArchive archive;
    // Onto the device of the optimizer's parameters (a GPU's state saved for a CPU run, rank 0's
    // cuda:0 state read by every rank, or the reverse): the archive alone would restore each
    // tensor where it was saved from.
    c10::optional<c10::Device> device;
    for (auto& group : s.optimizer->param_groups())
      if (!device && !group.params().empty()) device = group.params().front().device();
    archive.load_from(plan.optimizer_archive.data(), plan.optimizer_archive.size(), device);
    s.optimizer->load(archive);
  }
  // Before the scheduler's state (apply_engine_state): a scheduler then sets the lr, as
  // DeepSpeed's optimizer.load_state_dict comes before its lr_scheduler's.
  if (!plan.group_options.empty()) set_group_options(*s.optimizer, std::move(plan.group_options));
  if (o.load_module_only)
    restart_accumulation(s);
  else
    apply_engine_state(s, plan, o);
}

}  // namespace

int first_saved_rank_of_group(const TagReader& reader, const EngineState& s) {
  // Saved rank (stage * D + d) * T + t (comm::Grid) with d = 0, D the saved data-parallel size.
  const int tensor = reader.tensor_parallel_size();
  const int saved_dp = reader.world_size() / reader.pipeline_stages() / tensor;
  const int stage = s.pipeline_files ? s.pipeline_files->stage : 0;
  return stage * saved_dp * tensor + tensor_rank(s);
}

LoadedCheckpoint load_engine_checkpoint(EngineState& s, FileSystem& fs, const std::string& load_dir,
                                        const LoadOptions& o) {
  std::string tag = o.tag;
  if (tag.empty()) {
    tag = read_latest_tag(fs, load_dir);
    if (tag.empty()) {
      if (job_comm(s).rank() == 0)
        std::fprintf(stderr, "[deepspeed] WARNING: load_checkpoint: no '%s' to read the tag from; "
                     "nothing loaded\n", join_path(load_dir, kLatestFileName).c_str());
      return {};
    }
  }
  const std::string dir = join_path(load_dir, tag);
  comm::Communicator& job = job_comm(s);
  std::unique_ptr<TagReader> reader;
  Plan plan;
  // Planning makes missing optimizer state to load into; a refused load drops it again, as a
  // fresh SGD's first step differs with a (zero) buffer (zero/moment_state.h StateMadeSince).
  std::optional<zero::StateMadeSince> made_since;
  if (s.optimizer) made_since.emplace(*s.optimizer);
  try {
    run_agreed(job, "load_checkpoint '" + dir + "'", [&] {
      require_whole_step(s, "load_checkpoint");
      refuse_inside_gathered_scope(s, "load_checkpoint");
      reader = std::make_unique<TagReader>(fs, dir);
      plan = make_plan(*reader, s, o);
    });
  } catch (...) {
    if (made_since) made_since->drop(*s.optimizer);
    throw;
  }
  const std::string applying =
      "load_checkpoint '" + dir + "': applying (the engine may be partly loaded)";
  run_agreed(job, applying, [&] { apply_module(s, *reader, plan); });
  run_agreed(job, applying, [&] { apply_rest(s, *reader, plan, o); });
  if (o.load_module_only)
    s.stage->refresh_masters_from_model();
  else
    s.stage->finish_load(plan.adam_step);
  // A checkpoint is the state at a step: gradients accumulated since (a failed backward's among
  // them) belong to no step of it, as the micro-steps' loss sum does not.
  s.stage->discard_gradients();
  if (plan.load_extra_state) {
    run_agreed(job, applying, [&] { apply_extra_state(s, plan.extra_state); });
    // The extra state can hold this rank's own fp32 masters (0/1 Adam saved between two syncs):
    // carry them into the 16-bit weights too. finish_load only re-writes the same values anywhere
    // else.
    if (!o.load_module_only) s.stage->finish_load(plan.adam_step);
  }
  job.barrier();
  return {join_path(reader->dir(), reader->engine_file()), plan.client_state};
}

}  // namespace checkpoint
}  // namespace deepspeed
