// The optimizer's extra state (optim/extra_state.h) in checkpoints: written as tensors
// `optimizer_extra.replicated/<name>` and `optimizer_extra.per_rank/<name>` of each rank's
// optimizer-state file, listed in its metadata under "optimizer_extra" with the optimizer's kind.
#include <torch/torch.h>

#include "checkpoint/layout.h"
#include "checkpoint/tag_reader.h"
#include "runtime/engine_checkpoint.h"

namespace deepspeed {
namespace checkpoint {
namespace {

constexpr const char* kReplicated = "optimizer_extra.replicated/";
constexpr const char* kPerRank = "optimizer_extra.per_rank/";

optim::ExtraOptimizerState* extra_of(const EngineState& s) {
  return dynamic_cast<optim::ExtraOptimizerState*>(s.optimizer.get());
}

void add(ExtraStateEntries& out, const std::string& prefix,
         const std::map<std::string, at::Tensor>& tensors, nlohmann::json& names) {
  for (const auto& [name, t] : tensors) {
    at::Tensor c = t.detach().cpu().contiguous();
    out.entries.push_back({prefix + name, c.scalar_type(), c.sizes().vec()});
    out.tensors.push_back(c);
    names.push_back(name);
  }
}

// The saved extra state of `file`, when it holds some of `kind`.
void read_from(TagReader& reader, const std::string& file, const std::string& kind,
               const char* which, std::map<std::string, at::Tensor>& dst) {
  const nlohmann::json meta = reader.file_metadata(file);
  if (!meta.contains("optimizer_extra")) return;
  const auto& extra = meta.at("optimizer_extra");
  if (extra.value("kind", std::string()) != kind) return;
  const std::string prefix = std::string(which) == "replicated" ? kReplicated : kPerRank;
  for (const auto& name : extra.at(which)) {
    const std::string n = name.get<std::string>();
    dst[n] = reader.tensor(file, prefix + n);
  }
}

}  // namespace

ExtraStateEntries extra_state_entries(const EngineState& s) {
  ExtraStateEntries out;
  auto* extra = extra_of(s);
  if (!extra) return out;
  const optim::ExtraState state = extra->extra_state();
  nlohmann::json replicated = nlohmann::json::array(), per_rank = nlohmann::json::array();
  add(out, kReplicated, state.replicated, replicated);
  add(out, kPerRank, state.per_rank, per_rank);
  out.meta = {{"kind", extra->extra_state_kind()}, {"replicated", replicated}, {"per_rank", per_rank}};
  return out;
}

// Replicated state from the file of this pipeline stage's first saved data-parallel rank (any
// rank's would do); per-rank state from this rank's own file, only when every rank has its
// saved counterpart (the same world and pipeline).
optim::ExtraState read_extra_state(TagReader& reader, const EngineState& s) {
  optim::ExtraState out;
  auto* extra = extra_of(s);
  if (!extra) return out;
  comm::Communicator& job = job_comm(s);
  const int stages = s.pipeline_files ? s.pipeline_files->stages : 1;
  const bool same_layout = reader.world_size() == job.world_size() && reader.pipeline_stages() == stages;
  const std::string kind = extra->extra_state_kind();
  if (same_layout || reader.pipeline_stages() == stages) {
    read_from(reader, reader.partition_file(first_saved_rank_of_group(reader, s)), kind,
              "replicated", out.replicated);
  }
  if (same_layout)
    read_from(reader, reader.partition_file(job.rank()), kind, "per_rank", out.per_rank);
  return out;
}

void apply_extra_state(EngineState& s, const optim::ExtraState& saved) {
  if (auto* extra = extra_of(s)) extra->load_extra_state(saved);
}

}  // namespace checkpoint
}  // namespace deepspeed
