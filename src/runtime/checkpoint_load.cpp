// load_checkpoint in two phases. Phase 1 (local, agreed across ranks): read and verify everything
// this rank needs and check it matches the engine, changing nothing. Phase 2: write the state in,
// then the stage's finish_load makes every rank's parameters equal to the loaded masters.
// A checkpoint from another world size or stage loads through the fragments (layout.h): each
// rank assembles its own share from the pieces of whichever saved ranks overlap it.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstdio>
#include <optional>
#include <set>

#include "checkpoint/layout.h"
#include "checkpoint/tag_reader.h"
#include "deepspeed/errors.h"
#include "runtime/engine_checkpoint.h"

namespace deepspeed {
namespace checkpoint {
namespace {

// The engine counters and state objects of the model-states file, parsed (and so validated) in
// phase 1.
struct SavedEngineState {
  int64_t global_steps = 0, global_samples = 0, micro_steps = 0, skipped_steps = 0;
  std::unique_ptr<precision::LossScaler> loss_scaler;  // null: none saved
  nlohmann::json lr_scheduler;                         // null: none saved
  std::optional<LoaderState> loader;
};

// Everything read in phase 1, applied in phase 2.
struct Plan {
  nlohmann::json model_meta;
  SavedEngineState engine;
  std::vector<std::pair<at::Tensor, at::Tensor>> module_copies;  // (destination, source)
  std::vector<std::pair<at::Tensor, at::Tensor>> state_copies;   // fragments: masters, moments
  int64_t adam_step = -1;  // >= 0: set the Adam step
  std::string optimizer_archive;
  at::Tensor rng_state;
  bool fragments = false;  // masters came from fragments: finish_load must run
};

std::map<std::string, at::Tensor> module_tensors(torch::nn::Module& module) {
  std::map<std::string, at::Tensor> out;
  for (auto& item : module.named_parameters()) out[item.key()] = item.value();
  for (auto& item : module.named_buffers()) out[item.key()] = item.value();
  return out;
}

void plan_module(TagReader& reader, torch::nn::Module& module, bool strict, Plan& plan) {
  const std::string file = model_states_file_name();
  const std::string path = join_path(reader.dir(), file);
  const auto& saved = reader.file(file);
  std::set<std::string> in_file;
  auto mine = module_tensors(module);
  for (const auto& [name, src] : saved.tensors) {
    in_file.insert(name);
    auto it = mine.find(name);
    if (it == mine.end()) {
      if (strict)
        throw CheckpointError("checkpoint file '" + path + "' has tensor \"" + name +
                              "\" that the module lacks (pass load_module_strict=false to ignore)");
      continue;
    }
    if (it->second.sizes() != src.sizes())
      throw CheckpointError("checkpoint file '" + path + "': tensor \"" + name + "\" has shape " +
                            c10::str(src.sizes()) + ", the module's is " + c10::str(it->second.sizes()));
    plan.module_copies.emplace_back(it->second, src);
  }
  if (strict)
    for (const auto& [name, t] : mine)
      if (!in_file.count(name))
        throw CheckpointError("checkpoint file '" + path + "' lacks module tensor \"" + name +
                              "\" (pass load_module_strict=false to keep its current value)");
}

void check_trainable(const TagReader& reader, const EngineState& s,
                     const std::vector<std::string>& names) {
  std::map<std::string, const TrainableInfo*> saved;
  for (const auto& t : reader.trainable()) saved[t.name] = &t;
  for (size_t k = 0; k < names.size(); ++k) {
    auto it = saved.find(names[k]);
    if (it == saved.end())
      throw CheckpointError("checkpoint '" + reader.dir() + "' has no optimizer state for trainable "
                            "parameter \"" + names[k] + "\" (was it frozen when saved?)");
    if (it->second->numel != s.trainable[k].numel())
      throw CheckpointError("checkpoint '" + reader.dir() + "': parameter \"" + names[k] + "\" has " +
                            std::to_string(it->second->numel) + " elements, the module's has " +
                            std::to_string(s.trainable[k].numel()));
  }
}

// A libtorch optimizer's own archive holds whole per-rank state: usable where the saved and the
// current rank hold the same parameters (stage 0 anywhere, or the same stage and world size).
void plan_torch_archive(TagReader& reader, const EngineState& s, Plan& plan) {
  const int stage = s.config.zero_optimization.stage, world = s.comm->world_size();
  const bool replicated = reader.zero_stage() == 0 && s.stage->replicated_state();
  if (!replicated && (reader.zero_stage() != stage || reader.world_size() != world))
    throw CheckpointError("checkpoint '" + reader.dir() + "' holds a non-Adam optimizer's state "
                          "saved at world size " + std::to_string(reader.world_size()) +
                          ", ZeRO stage " + std::to_string(reader.zero_stage()) +
                          "; it reloads only at the same world size and stage (or stage 0 to stage "
                          "0), not at world size " + std::to_string(world) + ", stage " +
                          std::to_string(stage) + ". Pass load_optimizer_states=false to load the "
                          "weights alone");
  const int rank = replicated ? 0 : s.comm->rank();
  at::Tensor bytes = reader.tensor(optim_states_file_name(rank), "optimizer_archive");
  plan.optimizer_archive.assign(static_cast<const char*>(bytes.data_ptr()), bytes.numel());
}

void plan_fragments(TagReader& reader, EngineState& s, const std::vector<std::string>& names,
                    bool moments, Plan& plan) {
  plan.fragments = true;
  for (auto& f : s.stage->fragments_to_load(moments)) {
    const std::string& name = names.at(f.param);
    auto read = [&](const char* kind, const at::Tensor& dst) {
      at::Tensor buf = torch::empty({f.numel});
      reader.read_range(kind, name, f.offset, buf);
      plan.state_copies.emplace_back(dst, buf);
    };
    read("fp32", f.master);
    if (!moments) continue;
    read("exp_avg", f.exp_avg);
    read("exp_avg_sq", f.exp_avg_sq);
  }
}

void plan_optimizer(TagReader& reader, EngineState& s, const std::vector<std::string>& names,
                    bool load_states, Plan& plan) {
  const std::string& format = reader.optimizer_format();
  const bool ours_adam = s.stage->adam_step() >= 0;
  if (!load_states || !s.optimizer || format == kNoOptimizerState) {
    plan_fragments(reader, s, names, false, plan);
    return;
  }
  if (format == kAdamFragments) {
    if (!ours_adam)
      throw CheckpointError("checkpoint '" + reader.dir() + "' holds Adam moments but this engine's "
                            "optimizer is not Adam/AdamW: converting optimizer state is not "
                            "supported; pass load_optimizer_states=false to load the weights alone");
    plan_fragments(reader, s, names, true, plan);
    plan.adam_step = reader.meta().at("optimizer").at("adam_step").get<int64_t>();
    return;
  }
  if (format != kTorchArchive)
    throw CheckpointError("checkpoint manifest '" + reader.dir() + "': unknown optimizer format \"" +
                          format + "\"");
  if (ours_adam)
    throw CheckpointError("checkpoint '" + reader.dir() + "' holds a non-Adam optimizer's state but "
                          "this engine runs Adam; pass load_optimizer_states=false to load the "
                          "weights alone");
  plan_fragments(reader, s, names, false, plan);
  plan_torch_archive(reader, s, plan);
}

// Same world size and micro batch: the exact position. Otherwise the same number of samples
// consumed in the epoch, rounded down to whole steps of the new job.
LoaderState resumed_loader_state(const nlohmann::json& saved, const EngineState& s) {
  LoaderState ls{saved.at("epoch").get<int64_t>(), saved.at("batch_in_epoch").get<int64_t>()};
  const int64_t old_step = saved.at("micro_batch_size").get<int64_t>() * saved.at("world_size").get<int64_t>();
  const int64_t new_step = s.config.train_micro_batch_size_per_gpu * s.comm->world_size();
  if (old_step != new_step) ls.batch_in_epoch = ls.batch_in_epoch * old_step / new_step;
  return ls;
}

SavedEngineState parse_engine_state(const TagReader& reader, const nlohmann::json& m, const EngineState& s) {
  SavedEngineState e;
  try {
    e.global_steps = m.at("global_steps").get<int64_t>();
    e.global_samples = m.at("global_samples").get<int64_t>();
    e.micro_steps = m.at("micro_steps").get<int64_t>();
    e.skipped_steps = m.at("skipped_steps").get<int64_t>();
    if (!m.at("loss_scaler").is_null()) e.loss_scaler = precision::loss_scaler_from_state_dict(m.at("loss_scaler"));
    e.lr_scheduler = m.at("lr_scheduler");
    if (s.loader && !m.at("data_sampler").is_null()) e.loader = resumed_loader_state(m.at("data_sampler"), s);
  } catch (const nlohmann::json::exception& err) {
    throw CheckpointError("checkpoint file '" + join_path(reader.dir(), model_states_file_name()) +
                          "': engine state is malformed: " + err.what());
  }
  return e;
}

Plan make_plan(TagReader& reader, EngineState& s, const LoadOptions& o) {
  Plan plan;
  plan.model_meta = reader.file_metadata(model_states_file_name());
  plan_module(reader, *s.module, o.load_module_strict, plan);
  if (o.load_module_only) return plan;
  plan.engine = parse_engine_state(reader, plan.model_meta, s);
  const auto names = trainable_names(*s.module);
  check_trainable(reader, s, names);
  plan_optimizer(reader, s, names, o.load_optimizer_states, plan);
  if (reader.world_size() == s.comm->world_size())
    plan.rng_state = reader.tensor(optim_states_file_name(s.comm->rank()), "rng_state");
  return plan;
}

void set_rng_state(const at::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

void apply_engine_state(EngineState& s, Plan& plan, const LoadOptions& o) {
  auto& e = plan.engine;
  s.global_steps = e.global_steps;
  s.global_samples = e.global_samples;
  s.micro_steps = e.micro_steps;
  s.skipped_steps = e.skipped_steps;
  s.loss_since_boundary = at::Tensor();
  if (e.loss_scaler) s.loss_scaler = std::move(e.loss_scaler);
  if (o.load_lr_scheduler_states && s.scheduler && !e.lr_scheduler.is_null())
    s.scheduler->load_state_dict(e.lr_scheduler);
  if (e.loader) s.loader->load_state(*e.loader);
  if (plan.rng_state.defined()) set_rng_state(plan.rng_state);
}

void apply_module(Plan& plan) {
  torch::NoGradGuard no_grad;
  for (auto& [dst, src] : plan.module_copies) dst.detach().copy_(src);
}

// After apply_module (and, under stage 3, the re-partitioning of the module's weights), so the
// fp32 masters come from the optimizer files, not from the rounded 16-bit module copy.
void apply_rest(EngineState& s, Plan& plan, const LoadOptions& o) {
  torch::NoGradGuard no_grad;
  for (auto& [dst, src] : plan.state_copies) dst.copy_(src.view(dst.sizes()));
  if (!plan.optimizer_archive.empty()) {
    torch::serialize::InputArchive archive;
    archive.load_from(plan.optimizer_archive.data(), plan.optimizer_archive.size());
    s.optimizer->load(archive);
  }
  if (!o.load_module_only) apply_engine_state(s, plan, o);
}

}  // namespace

LoadedCheckpoint load_engine_checkpoint(EngineState& s, FileSystem& fs, const std::string& load_dir,
                                        const LoadOptions& o) {
  std::string tag = o.tag;
  if (tag.empty()) {
    tag = read_latest_tag(fs, load_dir);
    if (tag.empty()) {
      if (s.comm->rank() == 0)
        std::fprintf(stderr, "[deepspeed] WARNING: load_checkpoint: no '%s' to read the tag from; "
                     "nothing loaded\n", join_path(load_dir, kLatestFileName).c_str());
      return {};
    }
  }
  const std::string dir = join_path(load_dir, tag);
  std::unique_ptr<TagReader> reader;
  Plan plan;
  {
    // Stage 3: plan and copy the module against whole tensors; every rank loads the same file, and
    // rank 0's values are re-partitioned.
    FullParametersScope full(s, /*modifier_rank=*/0);
    run_agreed(*s.comm, "load_checkpoint '" + dir + "'", [&] {
      reader = std::make_unique<TagReader>(fs, dir);
      plan = make_plan(*reader, s, o);
    });
    run_agreed(*s.comm, "load_checkpoint '" + dir + "': applying", [&] { apply_module(plan); });
    full.release();
  }
  run_agreed(*s.comm, "load_checkpoint '" + dir + "': applying", [&] { apply_rest(s, plan, o); });
  if (o.load_module_only)
    s.stage->refresh_masters_from_model();
  else
    s.stage->finish_load(plan.adam_step);
  s.comm->barrier();
  nlohmann::json client = plan.model_meta.value("client_state", nlohmann::json::object());
  return {join_path(dir, model_states_file_name()), client};
}

}  // namespace checkpoint
}  // namespace deepspeed
