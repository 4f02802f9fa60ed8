// The pipeline layout of a checkpoint (checkpoint/layout.h): per-layer module files, one
// engine-state file per stage, and the manifest of the whole pipeline assembled on global rank 0
// from what every rank wrote. The optimizer-state files and the agreement between ranks are the
// plain save's (checkpoint_save.cpp); loading needs nothing of its own, as the manifest says where
// every module tensor and fragment is.
#include <torch/torch.h>

#include <set>

#include "checkpoint/layout.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/tag_reader.h"
#include "deepspeed/errors.h"
#include "runtime/engine_checkpoint.h"
#include "util/text.h"

namespace deepspeed {
namespace checkpoint {
namespace {

// The module's parameters and buffers whose names start with the file's prefix, named without it.
void write_layer_file(EngineState& s, FileSystem& fs, const std::string& dir, const ModuleFile& f) {
  NamedTensors tensors;
  for (auto& item : s.module->named_parameters())
    if (starts_with(item.key(), f.prefix))
      tensors.emplace_back(item.key().substr(f.prefix.size()), item.value().detach().to(at::kCPU));
  nlohmann::json buffer_names = nlohmann::json::array();
  for (auto& item : s.module->named_buffers())
    if (starts_with(item.key(), f.prefix)) {
      tensors.emplace_back(item.key().substr(f.prefix.size()), item.value().detach().to(at::kCPU));
      buffer_names.push_back(item.key().substr(f.prefix.size()));
    }
  const nlohmann::json meta = {{"layer", f.layer}, {"prefix", f.prefix}, {"buffer_names", buffer_names}};
  write_safetensors(fs, join_path(dir, f.file), tensors, {{kMetadataKey, meta.dump()}});
}

// The __metadata__ JSON of a just-written file (no manifest exists yet to verify it against).
nlohmann::json written_metadata(FileSystem& fs, const std::string& path) {
  auto file = fs.open_file(path);
  const SafetensorsIndex index = read_safetensors_index(*file, path);
  auto it = index.metadata.find(kMetadataKey);
  if (it == index.metadata.end())
    throw CheckpointError("checkpoint file '" + path + "' has no \"" + kMetadataKey + "\" metadata");
  return nlohmann::json::parse(it->second);
}

}  // namespace

void write_pipeline_module_files(EngineState& s, FileSystem& fs, const std::string& dir,
                                 const nlohmann::json& client_state) {
  const PipelineFiles& p = *s.pipeline_files;
  // ZeRO 0-2 only with a pipeline (initialize_pipeline refuses 3): every data-parallel rank holds
  // the stage's whole module, so any of them can write any of its files.
  const int dp_rank = s.comm->rank(), dp_size = s.comm->world_size();
  const bool spread = s.config.checkpoint.parallel_write_pipeline_stage;
  // With tensor parallelism each tensor rank's data-parallel group writes its slices' files.
  const int tensor = tensor_size(s);
  auto mine = p.written_by(p.stage);
  if (tensor > 1)
    for (auto& f : mine) f.file = tensor_rank_file(f, tensor_rank(s));
  for (size_t k = 0; k < mine.size(); ++k)
    if ((spread ? static_cast<int>(k % dp_size) : 0) == dp_rank) write_layer_file(s, fs, dir, mine[k]);
  if (dp_rank != 0) return;
  nlohmann::json meta = engine_metadata(s, client_state);
  meta["pipeline"] = {{"stage", p.stage}, {"stages", p.stages}, {"bounds", p.bounds}};
  if (tensor > 1) meta["pipeline"]["tensor_rank"] = tensor_rank(s);
  write_safetensors(fs, join_path(dir, model_states_file_name(model_parallel_rank(s))), {},
                    {{kMetadataKey, meta.dump()}});
}

nlohmann::json pipeline_manifest_metadata(EngineState& s, FileSystem& fs, const std::string& dir,
                                          const std::string& tag, const std::string& format,
                                          int64_t step, int world_size,
                                          std::vector<std::string>& files) {
  const PipelineFiles& p = *s.pipeline_files;
  const int tensor = tensor_size(s);
  const int dp_size = world_size / p.stages / tensor;
  files.clear();
  for (int mp = 0; mp < p.stages * tensor; ++mp) files.push_back(model_states_file_name(mp));
  nlohmann::json module_files = nlohmann::json::array();
  for (const auto& f : p.all) {
    ModuleFile first = f;  // tensor rank 0's file stands for the layer (TagReader)
    if (tensor > 1) first.file = tensor_rank_file(f, 0);
    for (int t = 0; t < tensor; ++t) files.push_back(tensor > 1 ? tensor_rank_file(f, t) : f.file);
    module_files.push_back({{"file", first.file}, {"prefix", f.prefix}, {"layer", f.layer}});
  }
  // Ranks are pipe-major, tensor innermost (comm::Grid): global rank = (stage * dp_size + data-
  // parallel rank) * tensor + tensor rank; the optim file is named by the model-parallel rank
  // stage * tensor + tensor rank. A tied parameter is trained identically on every stage holding
  // it; its fragments are listed once, from its lowest stage, so a loader finds exactly one copy
  // of each element. Every tensor rank's slices are alike: tensor rank 0's list the trainable
  // parameters and, with tensor parallelism, the stage's cuts.
  nlohmann::json trainable = nlohmann::json::array(), partitions = nlohmann::json::array();
  nlohmann::json split = nlohmann::json::object();
  std::set<std::string> earlier_stages, this_stage;
  for (int st = 0; st < p.stages; ++st) {
    for (int d = 0; d < dp_size; ++d)
      for (int t = 0; t < tensor; ++t) {
        const std::string file = optim_states_file_name(d, st * tensor + t);
        files.push_back(file);
        const nlohmann::json meta = written_metadata(fs, join_path(dir, file));
        if (d == 0 && t == 0) {
          for (const auto& item : meta.at("trainable"))
            if (!earlier_stages.count(item.at("name").get<std::string>())) {
              trainable.push_back(item);
              this_stage.insert(item.at("name").get<std::string>());
            }
          if (meta.contains("tensor_split")) split.update(meta.at("tensor_split"));
        }
        nlohmann::json frags = nlohmann::json::array();
        for (const auto& f : meta.at("fragments"))
          if (!earlier_stages.count(f.at(0).get<std::string>())) frags.push_back(f);
        nlohmann::json part = {
            {"rank", (st * dp_size + d) * tensor + t}, {"file", file}, {"fragments", frags}};
        if (tensor > 1) part["tensor_rank"] = t;
        partitions.push_back(part);
      }
    earlier_stages.insert(this_stage.begin(), this_stage.end());
  }
  nlohmann::json tensors = nlohmann::json::object();
  for (const auto& f : files) tensors[f] = safetensors_tensor_list(fs, join_path(dir, f));
  nlohmann::json meta = manifest_base(s, tag, format, step, world_size);
  meta["pipeline"] = {{"stages", p.stages}, {"data_parallel_size", dp_size}, {"bounds", p.bounds}};
  meta["engine_file"] = model_states_file_name(0);
  meta["module_files"] = module_files;
  meta["trainable"] = trainable;
  meta["partitions"] = partitions;
  meta["tensors"] = tensors;
  if (tensor > 1)
    meta["tensor_parallel"] = {{"size", tensor}, {"data_parallel_size", dp_size}, {"split", split}};
  return meta;
}

}  // namespace checkpoint
}  // namespace deepspeed
