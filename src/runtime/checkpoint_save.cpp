// save_checkpoint: every rank writes its optim-states file, rank 0 the model-states file (with
// tensor parallelism: each tensor rank's data-parallel rank 0 its mp_rank_TT file); after
// every rank has published its file, rank 0 writes the manifest and then `latest`. Each file goes
// through write_file_atomic (temp name, fsync, rename, fsync dir), so a save killed anywhere leaves
// the previous checkpoint and `latest` untouched, and a tag without a manifest is never loaded.
// Saving again under a tag that holds a complete checkpoint writes beside it and swaps the new
// save in once complete (checkpoint/tag_replacement.h), so the old one survives a failed re-save.
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <unordered_map>

#include "activation/rng_state.h"
#include "checkpoint/checksum.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/tag_reader.h"
#include "checkpoint/tag_replacement.h"
#include "checkpoint/weights_file.h"
#include "deepspeed/errors.h"
#include "deepspeed/tp.h"
#include "partition/partition.h"
#include "runtime/checkpoint_group_options.h"
#include "runtime/engine_checkpoint.h"
#include "zero/moment_state.h"
#include "zero/stage.h"

namespace deepspeed {
namespace checkpoint {
namespace {

void check_tag(const std::string& tag) {
  // `latest` is read back with its surrounding whitespace trimmed (as DeepSpeed's strip()), so
  // a tag with whitespace at either end, or a control character, could be saved but not loaded.
  const auto unreadable = [](unsigned char c) { return std::iscntrl(c) != 0; };
  const bool padded = !tag.empty() && (std::isspace(static_cast<unsigned char>(tag.front())) ||
                                       std::isspace(static_cast<unsigned char>(tag.back())));
  if (tag.empty() || tag == "." || tag == ".." || tag.find('/') != std::string::npos ||
      is_temp_file_name(tag) || is_replacement_name(tag) || tag == kLatestFileName || padded ||
      std::any_of(tag.begin(), tag.end(), unreadable))
    throw CheckpointError("save_checkpoint: tag \"" + tag +
                          "\" is not a valid folder name (no '/', not '.', '..' or 'latest', not "
                          "ending in .replacing or .replaced, no whitespace at either end, no "
                          "control characters)");
}

// The generators' states this rank saves. At a boundary, the current ones (a user's draws between
// step() and the save included). Between boundaries, those of the last boundary: the checkpoint
// drops the partial gradients and saves the loader's position at that boundary, so the resumed
// job trains those micro-batches again and must draw their dropout masks again.
EngineState::GeneratorStates rng_to_save(const EngineState& s) {
  if (between_boundaries(s)) return s.rng_at_boundary;
  return {checkpointing::generator_state(c10::kCPU),
          s.device.is_cuda() ? checkpointing::generator_state(s.device) : at::Tensor()};
}

at::Tensor bytes_tensor(const std::string& bytes) {
  at::Tensor t = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}


std::string optimizer_archive(torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  try {
    optimizer.save(archive);
  } catch (const c10::Error& e) {
    throw CheckpointError(std::string("save_checkpoint: this optimizer cannot be serialised by "
                                      "libtorch (only FusedAdam state is saved natively): ") +
                          e.what_without_backtrace());
  }
  std::string bytes;
  archive.save_to([&bytes](const void* data, size_t n) {
    bytes.append(static_cast<const char*>(data), n);
    return n;
  });
  return bytes;
}

nlohmann::json loader_state(const EngineState& s) {
  if (!s.loader) return nullptr;
  const LoaderState& ls = s.loader_at_boundary;
  return {{"epoch", ls.epoch},
          {"batch_in_epoch", ls.batch_in_epoch},
          {"micro_batch_size", s.config.train_micro_batch_size_per_gpu},
          {"world_size", s.comm->world_size()},
          // With the above, the saved job's micro-batches an epoch (checkpoint_load.cpp
          // resumed_loader_state), whatever the resuming job's dataset and drop_last.
          {"dataset_size", s.training_data->size()},
          {"drop_last", s.config.dataloader_drop_last}};
}

}  // namespace

nlohmann::json engine_metadata(const EngineState& s, const nlohmann::json& client_state) {
  return {
      {"global_steps", s.global_steps},
      {"global_samples", s.global_samples},
      {"micro_steps", s.micro_steps},
      {"skipped_steps", s.skipped_steps},
      {"lr_scheduler", s.scheduler ? s.scheduler->state_dict() : nlohmann::json(nullptr)},
      {"loss_scaler", s.loss_scaler ? s.loss_scaler->state_dict() : nlohmann::json(nullptr)},
      {"data_sampler", loader_state(s)},
      {"client_state", client_state},
      {"buffer_names", nlohmann::json::array()},
      {"shared_params", shared_params_json(s)},
      {"dp_world_size", s.comm->world_size()},
      {"mp_world_size", (s.pipeline_files ? s.pipeline_files->stages : 1) * tensor_size(s)},
      {"zero_stage", s.config.zero_optimization.stage},
      {"ds_version", library_version()},
      {"ds_config", s.config.raw},
  };
}

std::string optimizer_format(const EngineState& s) {
  if (!s.optimizer) return kNoOptimizerState;
  if (s.stage->adam_step() < 0) return kTorchArchive;
  return zero::moment_format(zero::moment_family(s.optimizer.get()));
}

int64_t agreed_optimizer_step(EngineState& s) {
  comm::Communicator& job = job_comm(s);
  const int64_t mine = s.stage->adam_step();
  if (job.world_size() == 1) return mine;
  at::Tensor step = torch::full({1}, mine, torch::kLong);
  job.all_reduce(step, comm::ReduceOp::Max)->wait();
  return step.item<int64_t>();
}

nlohmann::json trainable_list(const EngineState& s, const std::vector<std::string>& names) {
  nlohmann::json trainable = nlohmann::json::array();
  for (size_t k = 0; k < s.trainable.size(); ++k)
    trainable.push_back({{"name", names[k]},
                         {"shape", s.stage->whole_shape(s.trainable[k])},
                         {"numel", whole_numel(s, s.trainable[k])}});
  return trainable;
}

// This rank's share of masters and moments, its RNG states and (non-Adam) optimizer archive, or
// (Adam) its parameter groups' options (checkpoint_group_options.h). The fragments are streamed
// from the stage's state piece by piece (a swapped shard: one sub-group read from its file at a
// time) into a file whose header went first.
void write_optim_file(EngineState& s, zero::FragmentState& state, FileSystem& fs,
                      const std::string& dir, const std::string& file,
                      const std::vector<std::string>& names, const std::string& format,
                      int64_t step) {
  const bool saves_moments = is_fragment_format(format);
  const std::vector<std::string> kinds = state_kinds(format);
  std::vector<SafetensorsEntry> entries;
  nlohmann::json fragments = nlohmann::json::array();
  for (const auto& f : state.fragments()) {
    const std::string& name = names.at(f.param);
    fragments.push_back({name, f.offset, f.numel});
    for (const auto& kind : kinds)
      entries.push_back({fragment_tensor_name(kind, name), at::kFloat, {f.numel}});
  }
  const EngineState::GeneratorStates rng = rng_to_save(s);
  entries.push_back({"rng_state", rng.cpu.scalar_type(), rng.cpu.sizes().vec()});
  if (rng.cuda.defined())  // a CUDA engine: its device's generator (absent from older checkpoints)
    entries.push_back({"cuda_rng_state", rng.cuda.scalar_type(), rng.cuda.sizes().vec()});
  at::Tensor archive;
  if (format == kTorchArchive) {
    archive = bytes_tensor(optimizer_archive(*s.optimizer));
    entries.push_back({"optimizer_archive", archive.scalar_type(), archive.sizes().vec()});
  }
  ExtraStateEntries extra;
  if (format != kNoOptimizerState) extra = extra_state_entries(s);
  entries.insert(entries.end(), extra.entries.begin(), extra.entries.end());
  nlohmann::json meta = {{"rank", s.comm->rank()},
                         {"world_size", s.comm->world_size()},
                         {"zero_stage", s.config.zero_optimization.stage},
                         {"adam_step", step},
                         {"optimizer_format", format},
                         {"fragments", fragments},
                         {"trainable", trainable_list(s, names)}};
  if (!extra.meta.is_null()) meta["optimizer_extra"] = extra.meta;
  // The groups' lr, betas, eps, weight decay (a libtorch archive holds its own).
  if (saves_moments) meta[kParamGroupsKey] = group_options_json(*s.optimizer);
  // A pipeline stage's cuts, for the manifest of the whole pipeline (pipeline_manifest_metadata).
  if (s.pipeline_files && tensor_size(s) > 1) meta["tensor_split"] = tensor_split_json(s);
  const std::string path = join_path(dir, file);
  write_safetensors_streamed(
      fs, path, entries, {{kMetadataKey, meta.dump()}}, [&](SafetensorsWriter& w) {
        for (size_t i = 0; i < state.fragments().size(); ++i)
          for (size_t k = 0; k < kinds.size(); ++k)
            for (auto [offset, numel] : state.pieces(i)) {
              const at::Tensor piece = state.piece(i, offset, numel)[k];
              if (piece.defined())
                w.append(piece.to(torch::kFloat).contiguous());
              else
                w.append_zeros(at::kFloat, numel);  // a FusedAdam without state yet
            }
        w.append(rng.cpu);
        if (rng.cuda.defined()) w.append(rng.cuda);
        if (archive.defined()) w.append(archive);
        for (const auto& t : extra.tensors) w.append(t);
      });
}

nlohmann::json tensor_split_json(const EngineState& s) {
  nlohmann::json split = nlohmann::json::object();
  for (const auto& [name, dim] : tp::split_parameter_dims(*s.module))
    split[name] = {{"dim", dim.dim}, {"parts", dim.parts}};
  return split;
}

nlohmann::json manifest_base(const EngineState& s, const std::string& tag, const std::string& format,
                             int64_t step, int world_size) {
  return {{"format", kCheckpointFormat},
          {"format_version", kCheckpointFormatVersion},
          {"library_version", library_version()},
          {"tag", tag},
          {"world_size", world_size},
          {"zero_stage", s.config.zero_optimization.stage},
          {"precision", precision_name(s.config)},
          {"optimizer", {{"format", format}, {"adam_step", step}}},
          {"global_steps", s.global_steps},
          {"partition_alignment", partition::kAlignment}};
}

void write_whole_module(EngineState& s, FileSystem& fs, const std::string& path,
                        WeightsFormat format, const SafetensorsMetadata& metadata, bool writer,
                        bool frozen_parameters) {
  std::vector<SafetensorsEntry> entries;
  std::vector<bool> kept;  // per named_parameters() entry, the order of the walk
  // A parameter registered under several names (a tied embedding and head) is one tensor: a
  // torch.save file stores it once for all its names, as DeepSpeed's does.
  StorageOwners storage_of;
  std::unordered_map<const c10::TensorImpl*, size_t> first_name;
  for (auto& item : s.module->named_parameters()) {
    kept.push_back(frozen_parameters || item.value().requires_grad());
    if (!kept.back()) continue;
    storage_of.push_back(
        first_name.emplace(item.value().unsafeGetTensorImpl(), entries.size()).first->second);
    entries.push_back({item.key(), item.value().scalar_type(), s.stage->whole_shape(item.value())});
  }
  std::vector<at::Tensor> buffers;
  for (auto& item : s.module->named_buffers()) {
    storage_of.push_back(entries.size());
    entries.push_back({item.key(), item.value().scalar_type(), item.value().sizes().vec()});
    buffers.push_back(item.value().detach());
  }
  auto walk = [&](TensorSink* w) {
    size_t i = 0;
    for_each_whole_parameter(s, std::nullopt, [&](const std::string&, const at::Tensor& p, bool) {
      if (w && kept[i]) w->append(p.to(at::kCPU).contiguous());
      ++i;
    });
  };
  if (!writer) return walk(nullptr);
  bool walked = false;
  try {
    write_weights_streamed(
        fs, path, format, entries, metadata,
        [&](TensorSink& w) {
          walked = true;
          walk(&w);
          for (auto& b : buffers) w.append(b.to(at::kCPU).contiguous());
        },
        storage_of);
  } catch (...) {
    if (!walked) walk(nullptr);  // the file could not be created: still match the others' gathers
    throw;
  }
}

namespace {

// The module file: parameters (whole: stage 3 gathers one unit at a time) and buffers. Rank 0
// writes; every rank walks the parameters, as the gathers are collective.
void write_model_file(EngineState& s, FileSystem& fs, const std::string& dir,
                      const nlohmann::json& client_state) {
  nlohmann::json meta = engine_metadata(s, client_state);
  nlohmann::json buffer_names = nlohmann::json::array();
  for (auto& item : s.module->named_buffers()) buffer_names.push_back(item.key());
  meta["buffer_names"] = buffer_names;
  write_whole_module(s, fs, join_path(dir, model_states_file_name(tensor_rank(s))),
                     WeightsFormat::safetensors, {{kMetadataKey, meta.dump()}}, s.comm->rank() == 0,
                     /*frozen_parameters=*/true);
}

// Every file of a plain (or tensor-parallel) save: the model files, then the optim files in
// global rank order (tensor-parallel: rank = data-parallel rank * tensor size + tensor rank).
std::vector<std::string> plain_files(const EngineState& s) {
  const int tensor = tensor_size(s), data = s.comm->world_size();
  std::vector<std::string> files;
  for (int t = 0; t < tensor; ++t) files.push_back(model_states_file_name(t));
  for (int r = 0; r < data * tensor; ++r)
    files.push_back(optim_states_file_name(r / tensor, r % tensor));
  return files;
}

// The manifest of a plain save. Tensor-parallel: every tensor rank's data-parallel group laid its
// slices out alike (the slices have equal shapes), so each partition's fragments are those of its
// data-parallel rank; "tensor_parallel" says how to merge the slices (layout.h).
nlohmann::json manifest_metadata(EngineState& s, FileSystem& fs, const std::string& dir,
                                 const std::string& tag, const std::vector<std::string>& names,
                                 const std::vector<std::string>& files, const std::string& format,
                                 int64_t step) {
  const int data = s.comm->world_size(), tensor = tensor_size(s);
  std::vector<int64_t> numels;
  for (const auto& p : s.trainable) numels.push_back(whole_numel(s, p));
  nlohmann::json partitions = nlohmann::json::array();
  for (int r = 0; r < data * tensor; ++r) {
    const int d = r / tensor, t = r % tensor;
    nlohmann::json frags = nlohmann::json::array();
    for (auto& f : s.stage->fragments_of_rank(d, numels, data))
      frags.push_back({names[f.param], f.offset, f.numel});
    nlohmann::json part = {
        {"rank", r}, {"file", optim_states_file_name(d, t)}, {"fragments", frags}};
    if (tensor > 1) part["tensor_rank"] = t;
    partitions.push_back(part);
  }
  nlohmann::json tensors = nlohmann::json::object();
  for (auto& f : files) tensors[f] = safetensors_tensor_list(fs, join_path(dir, f));
  nlohmann::json meta = manifest_base(s, tag, format, step, data * tensor);
  meta["trainable"] = trainable_list(s, names);
  meta["partitions"] = partitions;
  meta["tensors"] = tensors;
  if (tensor > 1)
    meta["tensor_parallel"] = {
        {"size", tensor}, {"data_parallel_size", data}, {"split", tensor_split_json(s)}};
  return meta;
}

// checkpoint.tag_validation: every rank must save under the same tag (DeepSpeed compares a hash).
// Returns the tag this rank saves under. One checkpoint has one folder, written by every rank and
// published by rank 0's manifest, so ranks given different tags save under rank 0's: "Fail"
// refuses on every rank, "Warn" says so once (rank 0), "Ignore" says nothing. (DeepSpeed's
// ranks would each write their own tag's folder: two partial checkpoints, neither loadable.)
std::string agreed_tag(EngineState& s, comm::Communicator& job, const std::string& tag) {
  if (job.world_size() == 1) return tag;
  const std::string& mode = s.config.checkpoint.tag_validation;
  const double h = crc32c(tag.data(), tag.size());
  at::Tensor hi = torch::full({1}, h, torch::kDouble), lo = hi.clone();
  job.all_reduce(hi, comm::ReduceOp::Max)->wait();
  job.all_reduce(lo, comm::ReduceOp::Min)->wait();
  if (hi.item<double>() == lo.item<double>()) return tag;
  const std::string msg = "save_checkpoint: the ranks were given different tags (rank " +
                          std::to_string(job.rank()) + ": \"" + tag +
                          "\"); checkpoint.tag_validation is " + mode;
  if (mode == "Fail") throw CheckpointError(msg);
  if (mode != "Ignore" && job.rank() == 0)
    std::fprintf(stderr, "[deepspeed] WARNING: %s: every rank saves under rank 0's tag\n",
                 msg.c_str());
  // Rank 0's tag, its length first (check_tag bounds every rank's).
  at::Tensor length = torch::full({1}, static_cast<int64_t>(tag.size()), torch::kLong);
  job.broadcast(length, 0)->wait();
  at::Tensor bytes = torch::zeros({length.item<int64_t>()}, torch::kUInt8);
  if (job.rank() == 0) std::memcpy(bytes.data_ptr(), tag.data(), tag.size());
  job.broadcast(bytes, 0)->wait();
  return std::string(static_cast<const char*>(bytes.data_ptr()), bytes.numel());
}

// The stage's own idea of its share must be the layout the manifest describes (metadata only:
// nothing of the state is read).
void check_fragments_match_layout(EngineState& s, const zero::FragmentState& state) {
  std::vector<int64_t> numels;
  for (auto& p : s.trainable) numels.push_back(whole_numel(s, p));
  auto want = s.stage->fragments_of_rank(s.comm->rank(), numels, s.comm->world_size());
  const auto& got = state.fragments();
  bool same = want.size() == got.size();
  for (size_t i = 0; same && i < want.size(); ++i)
    same = want[i].param == got[i].param && want[i].offset == got[i].offset && want[i].numel == got[i].numel;
  if (!same)
    throw CheckpointError("save_checkpoint: the ZeRO stage's partition on rank " +
                          std::to_string(s.comm->rank()) +
                          " differs from the checkpoint layout (internal error)");
}

}  // namespace

std::string save_engine_checkpoint(EngineState& s, FileSystem& fs, const std::string& save_dir,
                                   const SaveOptions& o) {
  const std::string given =
      o.tag.empty() ? "global_step" + std::to_string(s.global_steps) : o.tag;
  check_tag(given);
  // Every rank of the job saves into the tag (a pipeline: every stage's data-parallel group), so
  // the agreements, the tag check and the manifest span the whole job, not s.comm.
  comm::Communicator& job = job_comm(s);
  const std::string tag = agreed_tag(s, job, given);
  const std::string dir = join_path(save_dir, tag);
  const bool rank0 = job.rank() == 0;
  const auto& names = s.trainable_names;
  const std::string format = optimizer_format(s);
  const auto* pipeline = s.pipeline_files.get();
  const std::string optim_file =
      optim_states_file_name(s.comm->rank(), model_parallel_rank(s));
  test_kill_point("start", tag);

  // What can refuse the save without reading the state: refused on every rank together, before
  // anything (the folder included) is written.
  nlohmann::json client_state;  // as stored (client_state_to_save)
  run_agreed(job, "save_checkpoint '" + dir + "': checking", [&] {
    require_whole_step(s, "save_checkpoint");
    // Inside a modifier scope the module file would get the edited weights and the optim files
    // the masters they are not yet written back to. Every rank has the same scopes open.
    refuse_inside_gathered_scope(s, "save_checkpoint");
    refuse_to_save_a_lost_step(s);
    // On every rank, though only the module files' writers store it: a client_state that cannot
    // be stored (a string that is not UTF-8) fails every rank here, not a writer alone later,
    // while the others wait in the module file's gathers.
    client_state = client_state_to_save(o.client_state);
  });
  // Re-saving a tag that holds a complete checkpoint: the new save goes into its `.replacing`
  // folder and is swapped in once complete, so a save that fails or dies loses nothing
  // (tag_replacement.h). Rank 0 decides and creates the folder; after this agreed phase every
  // rank sees which it is.
  std::unique_ptr<zero::FragmentState> state;
  bool replacing = false;  // rank 0's decision
  run_agreed(job, "save_checkpoint '" + dir + "': preparing the folder", [&] {
    state = s.stage->state_to_save();
    check_fragments_match_layout(s, *state);
    if (!rank0) return;
    finish_interrupted_replacement(fs, dir);
    replacing = holds_complete_checkpoint(fs, dir);
    const std::string target = replacing ? replacing_dir(dir) : dir;
    fs.make_dirs(target);
    fs.remove_stale_temp_files(target);
  });
  // Every rank takes rank 0's decision, not its own look at the folder: a shared file system
  // may still show another node what was there before rank 0 created the replacement.
  at::Tensor decision = torch::full({1}, replacing ? 1.0f : 0.0f);
  if (job.world_size() > 1) job.all_reduce(decision, comm::ReduceOp::Max)->wait();
  replacing = decision.item<float>() > 0;
  const int64_t step = agreed_optimizer_step(s);
  const std::string into = replacing ? replacing_dir(dir) : dir;
  run_agreed(job, "save_checkpoint '" + dir + "': writing the rank files", [&] {
    test_kill_point("before_optim_file", tag);
    write_optim_file(s, *state, fs, into, optim_file, names, format, step);
    state.reset();
    test_kill_point("after_optim_file", tag);
  });
  // Its own agreed phase: at stage 3 every rank takes part in writing it (the unit gathers).
  run_agreed(job, "save_checkpoint '" + dir + "': writing the module file", [&] {
    if (rank0) test_kill_point("before_model_file", tag);
    if (pipeline)
      write_pipeline_module_files(s, fs, into, client_state);
    else
      write_model_file(s, fs, into, client_state);
    if (rank0) test_kill_point("after_model_file", tag);
  });
  run_agreed(job, "save_checkpoint '" + dir + "': publishing", [&] {
    if (!rank0) return;
    std::vector<std::string> files;
    nlohmann::json meta;
    if (pipeline) {
      meta = pipeline_manifest_metadata(s, fs, into, tag, format, step, job.world_size(), files);
    } else {
      files = plain_files(s);
      meta = manifest_metadata(s, fs, into, tag, names, files, format, step);
    }
    test_kill_point("before_manifest", tag);
    write_manifest(fs, into, make_manifest(fs, into, files, meta));
    if (replacing) {
      test_kill_point("before_swap", tag);
      swap_in_replacement(fs, dir);
    }
    test_kill_point("before_latest", tag);
    if (o.save_latest) {
      try {
        fs.write_file_atomic(join_path(save_dir, kLatestFileName), tag);
      } catch (const IOError& e) {
        throw IOError("checkpoint '" + dir + "' is complete, but 'latest' was not updated: " +
                      e.what());
      }
    }
    test_kill_point("after_latest", tag);
  });
  return dir;
}

}  // namespace checkpoint
}  // namespace deepspeed
